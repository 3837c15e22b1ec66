"""tokenizers"""
