"""`--layout lfm2-split-v1 | lfm2-shared-v1`: the file names, graph names and manifest form of the
real LFM2.5 bundles, as the third-party LFM2 runner reads them.

* split-v1 (LFM2.5-230M): `lfm2-5-230m.json`, `lfm230_pf_512_w8.bin`, `lfm230_dec_512_w8.bin`,
  `lfm230_lmh_w8.bin` (graphs named as the files, without `.bin`), `lfm_embed_f16.bin`;
* shared-v1 (LFM2.5-350M): `lfm2-5-350m-2048.json`, `lfm_2048_shared.bin` holding the graphs
  `lfm_pf_512_f16` and `lfm_dec_2048_f16`, `lfm_lmh.bin` holding `lfm_lmh_f16`.

The names are fixed by the contract whatever the prefill rows or the context are. The manifest is
schema 1 without `model.arch` (the runner knows the model by its name), `params.kv_dim` instead
of head counts, no `layers` section (conv layers are the ones whose decode graph has
`past_conv_<i>`) and BOS as `chat.bos`. Every graph tensor is fp16, and so is the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qhx_export import ExportError
from qhx_export.families.config import Config

QHX = "qhx"
EMBED = "lfm_embed_f16.bin"
TOKENIZER = "tokenizer.json"


@dataclass(frozen=True)
class Layout:
    name: str
    model_name: str  # default model.name, and the manifest file's stem
    bins: dict[str, str]  # manifest contexts key -> file (prefill / decode / lmhead, or shared / lmhead)
    graphs: dict[str, str]  # role -> graph name inside the binary
    plan_params: bool  # the manifest names the graphs in plan.params

    @property
    def shared(self) -> bool:
        return "shared" in self.bins

    def bin_of(self, role: str) -> str:
        return self.bins["shared"] if self.shared and role in ("prefill", "decode") else self.bins[role]


LAYOUTS = {
    "lfm2-split-v1": Layout(
        "lfm2-split-v1",
        "lfm2-5-230m",
        {"prefill": "lfm230_pf_512_w8.bin", "decode": "lfm230_dec_512_w8.bin", "lmhead": "lfm230_lmh_w8.bin"},
        {"prefill": "lfm230_pf_512_w8", "decode": "lfm230_dec_512_w8", "lmhead": "lfm230_lmh_w8"},
        False,
    ),
    "lfm2-shared-v1": Layout(
        "lfm2-shared-v1",
        "lfm2-5-350m-2048",
        {"shared": "lfm_2048_shared.bin", "lmhead": "lfm_lmh.bin"},
        {"prefill": "lfm_pf_512_f16", "decode": "lfm_dec_2048_f16", "lmhead": "lfm_lmh_f16"},
        True,
    ),
}
CHOICES = (QHX, *LAYOUTS)


def get(name: str) -> Layout | None:
    return LAYOUTS.get(name)


def check(
    layout: Layout,
    family: str,
    *,
    prefill: str,
    verify_rows: int | None,
    io_f16: bool,
    name: str | None,
    model_name: str | None,
    extra: dict[str, bool],
) -> None:
    """One line for each option the layout cannot hold."""
    opt = f"--layout {layout.name}"
    if family != "lfm2":
        raise ExportError(f"{opt} is the LFM2 runner's bundle form; this model is {family}")
    if prefill != "window":
        raise ExportError(f"{opt}: the contract's prefill starts from an empty cache (--prefill window)")
    if verify_rows is not None:
        raise ExportError(f"{opt}: the contract has no verify graph (--verify-rows)")
    if not io_f16:
        raise ExportError(f"{opt}: every graph tensor is fp16 in this contract (--io f16, --precision fp16)")
    if name is not None:
        raise ExportError(f"{opt}: file and graph names are fixed by the contract (--name)")
    if model_name is not None and not model_name.lower().startswith("lfm"):
        raise ExportError(
            f"{opt}: --model-name {model_name!r} must start with 'lfm' (the runner knows the model by it)"
        )
    for o, bad in extra.items():
        if bad:
            raise ExportError(f"{opt}: {o} cannot hold in this contract")


def manifest(
    c: Config,
    layout: Layout,
    model_name: str | None,
    dsp_arch: str,
    ctx: int,
    bos: int | None,
    eos: Any,
) -> dict[str, Any]:
    """The schema-v1 manifest of the LFM2 runner (key order as the real bundles)."""
    contexts: dict[str, Any] = {k: {"bin": v} for k, v in layout.bins.items()}
    out: dict[str, Any] = {
        "schema_version": 1,
        "model": {"name": model_name or layout.model_name, "family": "llm", "dsp_arch": dsp_arch},
        "params": {
            "hidden": c.hidden,
            "vocab": c.vocab,
            "n_layers": c.n_layers,
            "max_ctx": ctx,
            "kv_dim": c.kv_rows,
            "head_dim": c.head_dim,
            "rope_theta": c.rope_theta,
            "eos_token_id": eos,
        },
        "artifacts": {"contexts": contexts, "embed": EMBED, "tokenizer": TOKENIZER},
    }
    if layout.plan_params:
        out["plan"] = {"params": dict(layout.graphs)}
    if bos is not None:
        out["chat"] = {"bos": [bos]}
    return out


def manifest_file(layout: Layout, model_name: str | None) -> str:
    return f"{model_name or layout.model_name}.json"
