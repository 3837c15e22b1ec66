"""Budgets and rate limits at the engine's own count: the policy file, the arithmetic of
rates (GCRA) and calendar budgets, the ``Limiter`` protocol with its in-process
implementation, and the header values. Pure: no aiohttp, no asyncio."""
