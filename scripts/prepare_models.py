"""Build the small random-weight scoring models the end-to-end suite serves with vLLM.

Run with the Python of a vLLM CPU environment (it has torch and transformers):

    VLLM_PY=$(scripts/vllm-cpu-env 0.29.0)
    $VLLM_PY scripts/prepare_models.py MINILM_DIR OUT_DIR

Weights are seeded, so every machine builds identical models; they are never committed.
Token accounting is real (the MiniLM tokenizer); scores are meaningless.
- cross-encoder-tiny: BertForSequenceClassification with num_labels=1.
- colbert-tiny: HF_ColBERT = a small BERT ("bert." weights) plus a bias-free
  ``linear.weight`` projection (64 -> 32). No dim/colbert_dim/projection_dim key in
  config.json: vLLM infers the size from the weights (those keys crash 0.29.0 and 0.32.0).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
MARKER = ".complete"


def small_bert_config(minilm: Path) -> dict[str, object]:
    config = json.loads((minilm / "config.json").read_text())
    config.update(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=512,
    )
    config.pop("_name_or_path", None)
    return config


def copy_tokenizer(minilm: Path, target: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy(minilm / name, target / name)


def build_cross_encoder(minilm: Path, target: Path) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(**small_bert_config(minilm), num_labels=1)
    config.architectures = ["BertForSequenceClassification"]
    BertForSequenceClassification(config).save_pretrained(target, safe_serialization=True)
    copy_tokenizer(minilm, target)


def build_colbert(minilm: Path, target: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    raw = small_bert_config(minilm)
    bert = BertModel(BertConfig(**raw), add_pooling_layer=False)
    weights = {f"bert.{k}": v.contiguous() for k, v in bert.state_dict().items()}
    weights["linear.weight"] = torch.randn(32, int(raw["hidden_size"])) * 0.05  # type: ignore[call-overload]
    target.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(target / "model.safetensors"))
    config = {**raw, "architectures": ["HF_ColBERT"], "model_type": "bert"}
    (target / "config.json").write_text(json.dumps(config, indent=2))
    copy_tokenizer(minilm, target)


def build(name: str, minilm: Path, out: Path) -> Path:
    target = out / name
    if (target / MARKER).exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    {"cross-encoder-tiny": build_cross_encoder, "colbert-tiny": build_colbert}[name](minilm, target)
    (target / MARKER).touch()
    return target


def main() -> int:
    minilm, out = Path(sys.argv[1]), Path(sys.argv[2])
    for name in ("cross-encoder-tiny", "colbert-tiny"):
        print(build(name, minilm, out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
