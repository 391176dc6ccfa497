"""Emulator bundles (`--target emu`): qnn-emu context binaries + embedding + tokenizer + manifest.

tests/test_emu.py decodes the binaries with the gguf package against the weights a GGUF was
written from; the parity suite runs the bundles through qhx_generate against HF transformers'
goldens. The context-binary format is tests/qnn-emu/FORMAT.md: `QHXEMUCB`, u32 version 1, u32
header length N, N bytes of JSON header, zero padding to D = align64(16 + N), then the weights,
each at D + offset (64-aligned).

Weights: with `weights="q"`, Q4_1 and Q8_0 GGUF tensors keep their raw GGML blocks (the emulator
dequantizes them as gguf / transformers do), F32 stays f32 and F16 stays f16; any other type, and
everything with `weights="f32"` or from a HF directory, is dequantized to f32.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from qhx_export import ExportError, NotImplementedYet
from qhx_export.dequant import GgmlType, type_name
from qhx_export.families.config import Config, f32_value
from qhx_export.read.base import Checkpoint, sha256_file
from qhx_export.write import lfm2_layout
from qhx_export.write.files import atomic_open

MAGIC = b"QHXEMUCB"
FORMAT_VERSION = 1
ALIGN = 64
QK = 32
RAW_ENCODINGS = {GgmlType.Q4_1: "q4_1", GgmlType.Q8_0: "q8_0"}
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}

Log = Callable[[str], None]
# (name, encoding, PyTorch shape, array whose bytes are the encoded tensor)
Weight = tuple[str, str, list[int], np.ndarray]


@dataclass(frozen=True)
class EmuOptions:
    name: str  # file / graph name prefix
    prefill_len: int = 64  # AR: prefill rows P
    ctx: int = 512  # KV capacity C
    io: str = "f32"  # f32 | f16 | ufixed16
    prefill: str = "window"  # window | past | none
    kv_layout: str = "pos_major"  # pos_major | head_major
    shared: bool = False  # prefill and decode graphs in one binary
    verify_rows: int | None = None  # a k-row verify graph over the decode cache (speculative decoding)
    verify_head: str | None = None  # logits | argmax: the lm-head over the verify's k rows in one execute
    calib: str | None = None  # value ranges JSON (QNN_EMU_CALIBRATE) for fixed-point I/O
    embed_dtype: str = "f32"
    weights: str = "q"  # q | f32
    model_name: str | None = None
    dsp_arch: str = "v81"
    soc_model: int = 87
    writer: str = "qhx-export"  # manifest source.writer
    layout: str = "qhx"  # qhx, or an LFM2 runner form (qhx_export.write.lfm2_layout)


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


# ---- graph headers -------------------------------------------------------------------------------


def scale_offset(dtype: str, lo: float, hi: float) -> tuple[float, int]:
    """QNN fixed-point params spanning [lo, hi] plus 5 % headroom (real = (q + offset) * scale);
    the same rule as qnn_emu::writer::scale_offset."""
    levels = {"ufixed16": 65535.0, "ufixed8": 255.0}.get(dtype)
    if levels is None:
        return 1.0, 0
    pad = 0.05 * max(hi - lo, 1e-3)
    lo, hi = min(lo, 0.0) - pad, max(hi, 0.0) + pad
    scale = float(np.float32((hi - lo) / levels))
    return scale, round(lo / scale)


def role(name: str) -> str:
    """Calibration role of an I/O tensor: past and new K/V of one layer share a range."""
    if name in ("x", "hidden"):
        return "x"
    if name in ("cos", "sin", "cos_local", "sin_local"):
        return "rope"
    if name in ("cmask", "cmask_local"):
        return "mask"
    for pre in ("past_conv_", "present_conv_", "conv_bx_"):  # one short-conv state: one range
        if name.startswith(pre):
            return "conv_" + name[len(pre) :]
    return name.removeprefix("past_").removeprefix("new_")


Ranges = dict[str, tuple[float, float]]


def io_tensor(
    name: str, dims: list[int], dtype: str, ranges: Ranges | None = None, y_role: str = "y"
) -> dict[str, Any]:
    scale, offset = 1.0, 0
    if dtype.startswith("ufixed"):
        r = y_role if name == "y" else role(name)
        # The mask minimum must beat any score against a never-written cache slot (zero bytes
        # decode to the range minimum, not 0.0); 0 stays exact (integer zero-point).
        fixed = {"rope": (-1.0, 1.0), "mask": (-30000.0, 0.0)}
        lo, hi = fixed.get(r) or (ranges or {}).get(r) or (-32.0, 32.0)
        scale, offset = scale_offset(dtype, lo, hi)
    return {"name": name, "dtype": dtype, "dims": list(dims), "scale": scale, "offset": offset}


def graphs_for(p: dict[str, Any], o: EmuOptions, ranges: Ranges | None) -> dict[str, dict[str, Any]]:
    """Graph headers: prefill "window" (AR=P, no past), "past" (chunked, reads the cache) or
    "none"; K/V "pos_major" [rows, K] or "head_major" [n_kv, rows, head_dim].

    Per-layer tensors follow the header's `layer_types`: attention layers have K/V (numbered by
    model layer), short-conv layers their state (`past_conv_{i}` -> `present_conv_{i}` [H, W]
    in decode, `conv_bx_{i}` [P, H] out of prefill); sliding-window layers read `cos_local`,
    `sin_local`, `cmask_local`."""
    H, Dh, V, L = p["hidden"], p["head_dim"], p["vocab"], p["n_layers"]
    nkv, P, C, io = p["n_kv_heads"], o.prefill_len, o.ctx, o.io
    K = nkv * Dh
    types = list(p.get("layer_types") or ["full_attention"] * L)
    W = p.get("conv_width", 3)
    local = "sliding_attention" in types

    def kv(rows: int) -> list[int]:
        return [nkv, rows, Dh] if o.kv_layout == "head_major" else [rows, K]

    # Fixed-point bundles apply the final norm in-graph: the raw residual stream carries
    # outliers (about 8000 in SmolLM2) that 16-bit activations cannot hold next to values of 1.
    final_norm = io.startswith("ufixed")

    def t(n: str, dims: list[int], dt: str = io) -> dict[str, Any]:
        return io_tensor(n, dims, dt, ranges, "y_norm" if final_norm else "y")

    def per_layer(fmt: str, dims: list[int]) -> list[dict[str, Any]]:
        return [
            t(fmt.format(kind=kind, i=i), dims) for i in range(L) if types[i] != "conv" for kind in ("k", "v")
        ]

    def conv_state(fmt: str, dims: list[int]) -> list[dict[str, Any]]:
        return [t(fmt.format(i=i), dims) for i in range(L) if types[i] == "conv"]

    def rope_mask(rows: int | None, mask_cols: int) -> list[dict[str, Any]]:
        """cos, sin, cmask (+ the sliding layers' _local copies): [rows, ...], or unbatched."""
        lead = [] if rows is None else [rows]
        names = [("cos", Dh), ("sin", Dh), ("cmask", mask_cols)]
        if local:
            names += [("cos_local", Dh), ("sin_local", Dh), ("cmask_local", mask_cols)]
        return [t(n, [*lead, d]) for n, d in names]

    # Logits stay f16 when activations are fixed point (W8A16 bundles keep an fp16 lm-head).
    lm_io = "f16" if io.startswith("ufixed") else io
    out: dict[str, dict[str, Any]] = {
        "decode": {
            "name": f"{o.name}_decode",
            "kind": "decode",
            "seq": 1,
            "ctx": C,
            "kv_layout": o.kv_layout,
            "final_norm": final_norm,
            "inputs": [
                t("x", [H]),
                *rope_mask(None, C),
                *per_layer("past_{kind}_{i}", kv(C)),
                *conv_state("past_conv_{i}", [H, W]),
            ],
            "outputs": [
                t("y", [H]),
                *per_layer("new_{kind}_{i}", kv(1)),
                *conv_state("present_conv_{i}", [H, W]),
            ],
        },
        "lmhead": {
            "name": f"{o.name}_lmhead",
            "kind": "lmhead",
            "seq": 1,
            "ctx": 0,
            "norm": not final_norm,
            "inputs": [t("hidden", [H], lm_io)],
            "outputs": [t("logits", [V], lm_io)],
        },
    }

    def rows_graph(tag: str, rows: int, past: bool) -> dict[str, Any]:
        """`rows` tokens per execute (the emulator's prefill kind), with or without past K/V."""
        return {
            "name": f"{o.name}_{tag}",
            "kind": "prefill",
            "seq": rows,
            "ctx": C if past else 0,
            "kv_layout": o.kv_layout,
            "final_norm": final_norm,
            "inputs": [t("x", [rows, H]), *rope_mask(rows, C + rows if past else rows)]
            + (per_layer("past_{kind}_{i}", kv(C)) if past else []),
            "outputs": [
                t("y", [rows, H]),
                *per_layer("new_{kind}_{i}", kv(rows)),
                *conv_state("conv_bx_{i}", [rows, H]),
            ],
        }

    if o.prefill != "none":
        out["prefill"] = rows_graph("prefill", P, o.prefill == "past")
    if o.verify_rows is not None:
        # Speculative decoding checks k - 1 drafted tokens in one execute over the cache.
        out["verify"] = rows_graph("verify", o.verify_rows, True)
    if o.verify_rows is not None and o.verify_head is not None:
        # ... and reads all k rows' logits (or their argmax) from one head execute.
        k = o.verify_rows
        y = t("logits", [k, V], lm_io) if o.verify_head == "logits" else t("ids", [k], "int32")
        out["verify_head"] = {
            "name": f"{o.name}_verify_head",
            "kind": "lmhead",
            "seq": k,
            "ctx": 0,
            "norm": not final_norm,
            "inputs": [t("hidden", [k, H], lm_io)],
            "outputs": [y],
        }
    return out


# ---- context binaries ---------------------------------------------------------------------------------


def write_context(
    path: str, model_hdr: dict[str, Any], graphs: list[dict[str, Any]], weights: list[Weight], o: EmuOptions
) -> int:
    """One context binary; returns its size."""
    entries, off = [], 0
    for name, enc, shape, arr in weights:
        entries.append({"name": name, "enc": enc, "shape": list(shape), "offset": off, "nbytes": arr.nbytes})
        off = align(off + arr.nbytes)
    header = {
        "model": model_hdr,
        "soc_model": o.soc_model,
        "dsp_arch": o.dsp_arch,
        "null_compute": False,
        "graphs": graphs,
        "weights": entries,
    }
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    data_start = align(16 + len(hb))
    f: BinaryIO
    with atomic_open(path) as f:
        f.write(MAGIC + struct.pack("<II", FORMAT_VERSION, len(hb)) + hb)
        f.write(b"\0" * (data_start - f.tell()))
        for (_, _, _, arr), e in zip(weights, entries, strict=True):
            f.write(b"\0" * (data_start + e["offset"] - f.tell()))
            f.write(memoryview(np.ascontiguousarray(arr)).cast("B"))
        return f.tell()


def read_context(path: str) -> tuple[dict[str, Any], int, bytes]:
    """Parse a context binary back: (header, data start D, file bytes). Raises ExportError."""
    with open(path, "rb") as f:
        blob = f.read()
    if blob[:8] != MAGIC:
        raise ExportError(f"{path}: not an emulator context binary (bad magic)")
    version, n = struct.unpack_from("<II", blob, 8)
    if version != FORMAT_VERSION:
        raise ExportError(f"{path}: format version {version}, expected {FORMAT_VERSION}")
    header = json.loads(blob[16 : 16 + n])
    d = align(16 + n)
    if any(blob[16 + n : d]):
        raise ExportError(f"{path}: header padding is not zero")
    for w in header["weights"]:
        if w["offset"] % ALIGN or d + w["offset"] + w["nbytes"] > len(blob):
            raise ExportError(f"{path}: weight {w['name']} is misplaced")
    return header, d, blob


def write_graph_binaries(
    out_dir: str,
    p: dict[str, Any],
    graphs: dict[str, dict[str, Any]],
    blk: list[Weight],
    head: list[Weight],
    o: EmuOptions,
) -> dict[str, Any]:
    """The context binaries; returns {"refs": manifest contexts, "sizes": {file: bytes}}."""
    refs: dict[str, dict[str, str]] = {}
    sizes: dict[str, int] = {}
    if graphs["decode"].get("final_norm"):
        blk = blk + [w for w in head if w[0] == "output_norm.weight"]
    lay = lfm2_layout.get(o.layout)
    if lay is not None:  # the LFM2 runner's files: the graphs were named by write_bundle
        for key, f in lay.bins.items():
            roles = ["prefill", "decode"] if key == "shared" else [key]
            w = head if key == "lmhead" else blk
            sizes[f] = write_context(os.path.join(out_dir, f), p, [graphs[r] for r in roles], w, o)
            refs[key] = {"bin": f}
        return {"refs": refs, "sizes": sizes}
    if o.shared:
        f = f"{o.name}_shared.bin"
        layer_graphs = [graphs[k] for k in ("prefill", "decode", "verify") if k in graphs]
        sizes[f] = write_context(os.path.join(out_dir, f), p, layer_graphs, blk, o)
        refs["shared"] = {"bin": f}
        for k in ("prefill", "decode", "verify"):
            if k in graphs:
                refs[k] = {"graph": graphs[k]["name"]}
    else:
        for k in ("prefill", "decode"):
            if k in graphs:
                f = f"{o.name}_{k}.bin"
                # The verify graph sits beside decode: one copy of the layer weights.
                extra = [graphs["verify"]] if k == "decode" and "verify" in graphs else []
                sizes[f] = write_context(os.path.join(out_dir, f), p, [graphs[k], *extra], blk, o)
                refs[k] = {"bin": f, "graph": graphs[k]["name"]}
                if extra:
                    refs["verify"] = {"bin": f, "graph": graphs["verify"]["name"]}
    f = f"{o.name}_lmhead.bin"
    # A verify head sits beside the lm-head: one copy of its weights.
    heads = [graphs[k] for k in ("lmhead", "verify_head") if k in graphs]
    sizes[f] = write_context(os.path.join(out_dir, f), p, heads, head, o)
    refs["lmhead"] = {"bin": f, "graph": graphs["lmhead"]["name"]}
    if "verify_head" in graphs:
        refs["verify_head"] = {"bin": f, "graph": graphs["verify_head"]["name"]}
    return {"refs": refs, "sizes": sizes}


def load_ranges(path: str | None) -> Ranges | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        return {k: (float(v[0]), float(v[1])) for k, v in raw.items()}
    except (OSError, ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
        raise ExportError(f"--calib {path}: not a value-ranges JSON ({e})") from e


# ---- weights ------------------------------------------------------------------------------------------


def model_header(ck: Checkpoint) -> dict[str, Any]:
    """The context binaries' "model" object (key order as the emulator bundles always had)."""
    c = ck.config
    out: dict[str, Any] = {
        "arch": ck.family.emu_arch,
        "hidden": c.hidden,
        "n_layers": c.n_layers,
        "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "ffn": c.ffn,
        "vocab": c.vocab,
        "rms_eps": c.rms_eps,
    }
    # the later families' keys, only where they differ from the Llama layer's defaults
    if c.layer_types is not None and any(t != "full_attention" for t in c.types):
        out["layer_types"] = list(c.types)
    if "sliding_attention" in c.types:
        out["sliding_window"] = c.sliding_window
    if c.attn_scale is not None:
        out["attn_scale"] = f32_value(c.attn_scale)
    if c.act != "silu":
        out["act"] = c.act
    if "conv" in c.types:
        out["conv_width"] = c.conv_width or 3
    return out


def encoded(ck: Checkpoint, name: str, mode: str) -> Weight:
    """(name, enc, shape, array) of one tensor as the emulator stores it."""
    from qhx_export.read.gguf import GgufCheckpoint

    shape = ck.shapes[name]
    off = ck.config.norm_offset_of(name)
    if off:  # the emulator's norms multiply by the stored weight: the offset goes in
        return name, "f32", shape, np.ascontiguousarray(ck.float32(name) + np.float32(off), dtype="<f4")
    if isinstance(ck, GgufCheckpoint):
        qt = ck.tensors[name].qtype
        if mode == "q" and qt in RAW_ENCODINGS:
            if shape[-1] % QK:
                raise ExportError(f"{ck.path}: tensor {name}: last dim {shape[-1]} is not a multiple of {QK}")
            return name, RAW_ENCODINGS[GgmlType(qt)], shape, ck.raw_rows(name)
        if mode == "q" and qt == GgmlType.F16:
            return name, "f16", shape, ck.raw_rows(name).view("<f2").reshape(shape)
        if qt == GgmlType.F32:
            return name, "f32", shape, ck.raw_rows(name).view("<f4").reshape(shape)
    return name, "f32", shape, np.ascontiguousarray(ck.float32(name), dtype="<f4")


def weights_description(ck: Checkpoint, o: EmuOptions, encs: set[str]) -> str:
    from qhx_export.read.gguf import GgufCheckpoint

    if not isinstance(ck, GgufCheckpoint):
        return "f32 (from safetensors)"
    if o.weights != "q":
        return "f32 (dequantized with qhx_export.dequant)"
    kept = {GgmlType.F32, GgmlType.F16, *RAW_ENCODINGS}
    dequantized = {type_name(t.qtype).lower() for t in ck.tensors.values() if t.qtype not in kept}
    quant = sorted(encs & set(BLOCK_BYTES))
    desc = (
        f"{'/'.join(quant)} raw blocks (dequantized by the emulator as gguf/transformers do)"
        if quant
        else "f32/f16 as stored"
    )
    if dequantized:
        desc += f"; {'/'.join(sorted(dequantized))} dequantized to f32 with qhx_export.dequant"
    return desc


def manifest_params(ck: Checkpoint, ctx: int) -> dict[str, Any]:
    """The manifest's `params`: the model's shape, the context, RoPE and the end ids (the same
    block for emulator and HTP bundles)."""
    c = ck.config
    params: dict[str, Any] = {
        **c.shape_params(),
        "max_ctx": ctx,
        "rope_theta": c.rope_theta,
        "bos_token_id": ck.bos_token_id(),
        "eos_token_id": ck.eos_token_id(),
    }
    if c.rope_scaling:
        params["rope_scaling"] = dict(c.rope_scaling)
    return params


# ---- the bundle ---------------------------------------------------------------------------------------


def manifest(
    ck: Checkpoint, o: EmuOptions, files: dict[str, str], refs: dict[str, Any], encs: set[str]
) -> dict[str, Any]:
    from qhx_export.read.gguf import GgufCheckpoint

    params = manifest_params(ck, o.ctx)
    if isinstance(ck, GgufCheckpoint):
        source: dict[str, Any] = {"gguf": os.path.basename(ck.path), "gguf_sha256": sha256_file(ck.path)}
    else:
        source = {"hf": os.path.basename(os.path.abspath(ck.path)), **generated_weights(ck.path)}
    source.update({"writer": o.writer, "weights": weights_description(ck, o, encs)})
    out: dict[str, Any] = {
        "schema_version": 1,
        "model": {
            "name": o.model_name or ck.default_name(),
            "family": "llm",
            "arch": ck.family.emu_arch,
            "dsp_arch": o.dsp_arch,
            "soc_model": o.soc_model,
            "n_params": ck.n_params(),
        },
        "params": params,
        "artifacts": {
            "contexts": refs,
            "embed": {"file": files["embed"], "dtype": o.embed_dtype},
            "tokenizer": files["tokenizer"],
        },
        "plan": {"op": host_op(ck.family.emu_arch), "ar": o.prefill_len if o.prefill != "none" else 1},
        "source": source,
    }
    template = ck.chat_template()
    if template:
        out["chat"] = {"template": template}
    layers = layers_section(ck.config, o.ctx)
    if layers:
        out["layers"] = layers
    return out


def host_op(arch: str) -> str:
    """QHexRT's host-op name for the family (informational: qhx runs the plan it resolves)."""
    return "qwen3_generate" if arch == "qwen3" else "llama_generate"


def generated_weights(path: str) -> dict[str, str]:
    """{"weights_sha256": ...} of a generated HF checkpoint (tests/fixtures/tiny_models.py writes it in
    qhx_source.json), else {}. The parity goldens record the checksum, so a parity run refuses a
    bundle made from other weights."""
    stamp = os.path.join(path, "qhx_source.json")
    if not os.path.isfile(stamp):
        return {}
    with open(stamp, encoding="utf-8") as f:
        made = json.load(f)
    if isinstance(made, dict) and isinstance(made.get("weights_sha256"), str):
        return {"weights_sha256": made["weights_sha256"]}
    return {}


def layers_section(c: Config, ctx: int | None = None) -> dict[str, Any] | None:
    """The manifest's `layers` object (per-layer types and what differs by type), or None when
    every layer is the plain full-attention one. A window wider than the cache `ctx` is written
    as `ctx`: no position past the cache exists, so the two see the same keys, and the runtime
    refuses a window larger than its cache."""
    types = c.types
    if all(t == "full_attention" for t in types):
        return None
    out: dict[str, Any] = {"types": list(types)}
    if "sliding_attention" in types:
        out["sliding_window"] = min(c.sliding_window, ctx) if ctx and c.sliding_window else c.sliding_window
        out["rope"] = {
            "sliding_attention": {"theta": c.rope_local_theta, "cos": "cos_local", "sin": "sin_local"}
        }
        out["masks"] = {"sliding_attention": "cmask_local"}
    if "conv" in types:
        out["state"] = {
            "conv": {
                "past": "past_conv_{i}",
                "present": "present_conv_{i}",
                "seed": "conv_bx_{i}",
                "width": c.conv_width or 3,
            }
        }
    return out


def check_options(o: EmuOptions) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", o.name):
        raise ExportError(f"--name {o.name!r}: use letters, digits, '_', '-', '.'")
    if o.prefill_len < 1 or o.ctx < 1:
        raise ExportError(f"--ar {o.prefill_len} / --ctx {o.ctx}: both must be positive")
    if o.prefill_len > o.ctx:
        raise ExportError(f"--ar {o.prefill_len} exceeds --ctx {o.ctx}")
    if o.verify_rows is not None:
        if not 2 <= o.verify_rows <= o.ctx:
            raise ExportError(f"--verify-rows {o.verify_rows}: must be 2 or more and at most --ctx {o.ctx}")
        if o.prefill != "none" and o.verify_rows >= o.prefill_len:
            raise ExportError(
                f"--verify-rows {o.verify_rows}: must be fewer than the prefill's --ar {o.prefill_len}"
            )
    if o.io.startswith("ufixed") and not o.calib:
        raise ExportError(f"--io {o.io} needs --calib (value ranges recorded with QNN_EMU_CALIBRATE)")


def check_family_options(ck: Checkpoint, o: EmuOptions) -> None:
    """What a family's graphs cannot do: short-conv state has no chunked prefill or verify."""
    if "conv" in ck.config.types:
        fam = ck.family.name
        if o.verify_rows is not None:
            raise ExportError(
                f"--verify-rows: {fam} short-conv layers have no verify graph (no state rollback)"
            )
        if o.prefill == "past":
            raise ExportError(f"--prefill past: {fam} short-conv layers have no chunked prefill; use window")


def write_bundle(
    ck: Checkpoint,
    out_dir: str,
    o: EmuOptions,
    log: Log,
    progress: Callable[[str, int], Callable[[], None]] | None = None,
) -> tuple[str, dict[str, int]]:
    """Write the bundle into `out_dir` (which must exist); returns (manifest path, {file: bytes}).

    `progress(stage, total)` returns a tick function (the CLI's tqdm bars)."""
    check_options(o)
    if ck.family.emu_arch is None:
        raise NotImplementedYet(f"{ck.path}: the emulator has no {ck.family.name} graphs; use --target htp")
    check_family_options(ck, o)
    c = ck.config
    ranges = load_ranges(o.calib)
    hdr = model_header(ck)
    graphs = graphs_for(hdr, o, ranges)
    lay = lfm2_layout.get(o.layout)
    if lay is not None:
        for r, g in graphs.items():
            g["name"] = lay.graphs[r]

    blk_names = [n for n in ck.names() if n.startswith("blk.")]
    tick = progress("convert weights", len(blk_names) + 2) if progress else (lambda: None)
    blk: list[Weight] = []
    for n in blk_names:
        blk.append(encoded(ck, n, o.weights))
        tick()
    head_w = "token_embd.weight" if c.tied else "output.weight"
    head = [encoded(ck, n, o.weights) for n in ("output_norm.weight", head_w)]
    tick()
    encs = {w[1] for w in blk + head}
    written = write_graph_binaries(out_dir, hdr, graphs, blk, head, o)
    sizes: dict[str, int] = dict(written["sizes"])
    del blk, head

    files = {"embed": f"{o.name}_embed_{o.embed_dtype}.bin", "tokenizer": "tokenizer.json"}
    if lay is not None:
        files = {"embed": lfm2_layout.EMBED, "tokenizer": lfm2_layout.TOKENIZER}
    emb = ck.float32("token_embd.weight")
    scale = ck.family.embed_scale(c)
    if scale is not None:  # Gemma: the host table carries sqrt(hidden), the lm-head does not
        emb = (emb * np.float32(scale)).astype(np.float32)
    emb = emb.astype("<f2" if o.embed_dtype == "f16" else "<f4", copy=False)
    with atomic_open(os.path.join(out_dir, files["embed"])) as f:
        f.write(memoryview(np.ascontiguousarray(emb)).cast("B"))
    sizes[files["embed"]] = emb.nbytes
    del emb
    tick()

    tok = ck.tokenizer_json()
    with atomic_open(os.path.join(out_dir, files["tokenizer"])) as f:
        f.write(tok)
    sizes[files["tokenizer"]] = len(tok)

    man_name = f"{o.name}.json"
    man = manifest(ck, o, files, written["refs"], encs)
    if lay is not None:
        man_name = lfm2_layout.manifest_file(lay, o.model_name)
        man = lfm2_layout.manifest(
            c, lay, o.model_name, o.dsp_arch, o.ctx, ck.bos_token_id(), ck.eos_token_id()
        )
    data = json.dumps(man, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"
    with atomic_open(os.path.join(out_dir, man_name)) as f:
        f.write(data)
    sizes[man_name] = len(data)
    for name, size in sizes.items():
        log(f"wrote {os.path.join(out_dir, name)} ({size} bytes)")
    return os.path.join(out_dir, man_name), sizes
