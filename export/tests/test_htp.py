"""--target htp end to end on tiny models: compiled for the HTP by onnxruntime-qnn, run by
qhx_generate on the x86 simulator (--verify) with ids equal to the ORT loop over the same
binaries; --arch all; the report. Skipped without onnxruntime-qnn or qhx_generate.

The SmolLM2-135M exports (real weights) run in two sizes: marked `e2e`, sized for CI
(scripts/export-e2e.sh, in scripts/test.sh's background real-backend stage), and marked `slow`,
full calibration and 8 verify steps with the ORT loop (scripts/export-slow.sh, ~2-12 min each).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from qhx_export.cli import ARCHES, main

pytest.importorskip("onnxruntime_qnn")
SMOLLM2 = Path(os.environ.get("QHX_CACHE", Path.home() / ".cache" / "qhx")) / "assets" / "smollm2"
SMOLLM2_GGUF = SMOLLM2 / "SmolLM2-135M-Instruct.Q4_1.gguf"


def qhx_generate() -> str:
    from qhx_export import ExportError
    from qhx_export.verify.run import find_qhx_generate

    try:
        return find_qhx_generate()
    except ExportError:
        pytest.skip("qhx_generate not built")


def export(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    rc = main(args)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.out.strip().splitlines(), cap.err


@pytest.mark.parametrize(("family", "precision"), [("llama", "fp16"), ("qwen2", "w8a16"), ("qwen3", "fp16")])
def test_tiny_verify(
    tmp_path: Path,
    tiny_gguf: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
    family: str,
    precision: str,
) -> None:
    qhx_generate()
    path = tiny_gguf(family, name=f"tiny-{family}.gguf")
    out = tmp_path / "b"
    args = [str(path), "-o", str(out), "--arch", "v75", "--precision", precision, "--ar", "4", "--ctx", "48"]
    rc, lines, err = export([*args, "--verify", "--verify-tokens", "6"], capsys)
    # random tiny weights leave near-ties that 8-bit weights reorder: the threshold may fail
    # there (exit 4), the ORT-loop equality may not
    assert rc in (0, 4), err
    rep = json.loads((out / "export-report.json").read_text())
    (res,) = rep["verify"].values()
    rows = res["rows"]
    assert len(rows) == 2 and all(r["ort_equal"] for r in rows), rows
    if precision == "fp16":
        assert rc == 0 and res["mean"] >= 0.98
    man = json.loads(Path(lines[-1]).read_text())
    assert man["model"]["dsp_arch"] == "v75" and man["model"]["soc_model"] == 60
    assert set(man["artifacts"]["contexts"]) == {"prefill", "decode", "lmhead"}
    readme = (out / "README.md").read_text()
    assert readme.startswith("# ")
    check_readme(readme, out, ["tiny-" + family + ".json"], "v75")
    assert not (tmp_path / "b.partial").exists()


def readme_files(readme: str) -> list[str]:
    """The file column of the bundle README's file table."""
    part = readme.split("## Files", 1)[1].split("\n## ", 1)[0]
    return [ln.split("|")[1].strip() for ln in part.splitlines() if ln.startswith("| ") and " | " in ln][1:]


def check_readme(readme: str, out: Path, manifests: list[str], arch: str) -> None:
    """The README's file table is the bundle's files (paths as they sit), and its simulator
    line, run as written, generates with the bundle."""
    files = readme_files(readme)
    assert "README.md" in files and all((out / f).is_file() for f in files), files
    want = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != ".qhx-export.json"}
    assert set(files) == want
    for m in manifests:
        assert m in files
    block = readme.split("## Run it", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    sim = [ln for ln in block.splitlines() if not ln.startswith("cargo build")]
    assert sim[0].startswith("cd ") and sim[-1].startswith("target/release/qhx_generate ")
    r = subprocess.run(["bash", "-ec", "\n".join(sim)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-600:]
    phone = readme.split("## Run it", 1)[1].split("```bash\n", 2)[2].split("```", 1)[0]
    n = "<NN>" if arch == "all" else arch[1:]
    assert f"libQnnHtpV{n}Stub.so libQnnHtpV{n}Skel.so /data/local/tmp/qhx/" in phone
    desc = "bundle" if arch == "all" else f"bundle/{manifests[0]}"
    assert f"./qhx_generate /data/local/tmp/qhx/{desc} libQnnHtp.so libQnnSystem.so" in phone


def test_arch_all(tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """One directory per arch, each binary pinned to its soc (qhx_inspect reads it back) and
    run by qhx_generate on the simulator."""
    binary = qhx_generate()
    path = tiny_gguf("llama", name="tiny.gguf")
    out = tmp_path / "b"
    rc, lines, err = export(
        [str(path), "-o", str(out), "--arch", "all", "--prefill", "none", "--ar", "4", "--ctx", "16"], capsys
    )
    assert rc == 0, err
    assert [Path(p).parent.name for p in lines[:-1]] == ["v73", "v75", "v79", "v81"]
    assert lines[-1] == str(out)
    check_readme((out / "README.md").read_text(), out, [f"{a}/tiny.json" for a in ARCHES], "all")
    from qhx_export.verify.run import qnn_libdir

    inspect = Path(binary).parent / "qhx_inspect"
    for arch, soc in (("v73", 57), ("v75", 60), ("v79", 69), ("v81", 87)):
        man = json.loads((out / arch / "tiny.json").read_text())
        assert man["model"]["soc_model"] == soc
        if inspect.exists():
            binf = out / arch / man["artifacts"]["contexts"]["decode"]["bin"]
            r = subprocess.run(
                [str(inspect), "--json", "-", str(Path(qnn_libdir()) / "libQnnSystem.so"), str(binf)],
                capture_output=True,
                text=True,
                env=dict(os.environ, LD_LIBRARY_PATH=qnn_libdir()),
            )
            assert r.returncode == 0, r.stderr
            doc, _ = json.JSONDecoder().raw_decode(r.stdout)
            assert doc["binaries"][0]["soc_model"] == soc
        # each arch's binaries run 4 tokens on the simulator, ids equal to the ORT loop's
        from qhx_export.verify.loop import load_bundle
        from qhx_export.verify.run import run_qhx

        ids = [3, 7, 11]
        got = run_qhx(binary, str(out / arch / "tiny.json"), ids, 4, None)
        assert got == load_bundle(str(out / arch / "tiny.json")).generate(ids, 4), arch


def smollm2_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, precision: str, more: list[str]
) -> tuple[int, str, dict]:
    """SmolLM2-135M (the cached GGUF, real weights) exported --target htp with --verify: qhx_generate
    on the simulator, 2 prompts teacher-forced on the float reference. (rc, stderr, verify result)."""
    if not SMOLLM2_GGUF.exists():
        pytest.fail(f"{SMOLLM2_GGUF} missing (scripts/fetch-assets.sh smollm2)")
    qhx_generate()
    out = tmp_path / "b"
    args = [str(SMOLLM2_GGUF), "-o", str(out), "--arch", arch, "--precision", precision, "--ar", "16"]
    rc, lines, err = export([*args, "--verify", *more], capsys)
    rep = json.loads((out / "export-report.json").read_text())
    (res,) = rep["verify"].values()
    man = json.loads(Path(lines[-1]).read_text())
    soc = {"v75": 60, "v79": 69, "v81": 87}[arch]
    assert man["model"]["dsp_arch"] == arch and man["model"]["soc_model"] == soc
    assert len(res["rows"]) == 2 and all(len(r["qhx"]) == r["steps"] > 0 for r in res["rows"]), res
    # the ORT loop over the same binaries gives the same ids (None: not run, --no-ort-check)
    want = None if "--no-ort-check" in more else True
    assert all(r["ort_equal"] is want for r in res["rows"]), res
    if precision == "w4a16":
        # the default 4-bit method (seqmse+gptq, Hadamard rotation) does not reach the 85 % bar on
        # this 135M model, whose weights came as asymmetric Q4_1 (llama.cpp's symmetric Q4_0 of
        # them keeps 64.5 %: README, "4-bit weights"); it must not collapse either
        assert rc in (0, 4) and res["mean"] >= 0.4, (err[-600:], res["mean"])
        assert rep["quantization"]["method"]["method"] == "seqmse+gptq", rep["quantization"]
        assert rep["graph"]["rotate"].startswith("randomized Hadamard 576"), rep["graph"]
    else:
        assert rc == 0, err[-600:]
    return rc, err, res


CASES_E2E = [("v75", "fp16"), ("v79", "w8a16"), ("v81", "w4a16")]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "precision"), CASES_E2E)
def test_smollm2(tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, precision: str) -> None:
    """Full size: the built-in calibration (512 decode steps), 8 steps per prompt, ids equal to the
    ORT loop over the same binaries."""
    smollm2_export(tmp_path, capsys, arch, precision, ["--ctx", "256", "--verify-tokens", "8"])


@pytest.mark.e2e
@pytest.mark.parametrize(("arch", "precision"), CASES_E2E)
def test_smollm2_ci(tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, precision: str) -> None:
    """Sized for CI (scripts/export-e2e.sh; the simulator runs a quantized SmolLM2 decode step in
    seconds): the same exports with 64 calibration decode steps and 4 steps per prompt (w4a16's
    method on its first 2,048 calibration tokens); fp16
    also checks its ids against the ORT loop (the quantized paths' ORT equality runs on tiny models
    in the fast suite, and at full size in test_smollm2)."""
    more = ["--ctx", "128", "--verify-tokens", "4", "--calib-steps", "64"]
    if precision != "fp16":
        more.append("--no-ort-check")
    if precision == "w4a16":  # the default method on 2k of its ~12k tokens: 166 s, not 457 s
        more += ["--method-tokens", "2048"]
    smollm2_export(tmp_path, capsys, arch, precision, more)


def test_genie_format(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--format both: the qhx manifest and genie_config.json in one directory; qhx_generate runs the
    Genie bundle (--verify), and Qualcomm's libGenie.so gives the same greedy ids."""
    qhx_generate()
    path = tiny_gguf("llama", name="tiny.gguf")
    out = tmp_path / "b"
    args = [str(path), "-o", str(out), "--arch", "v79", "--ar", "4", "--ctx", "32", "--format", "both"]
    rc, lines, err = export([*args, "--verify", "--verify-tokens", "6"], capsys)
    assert rc == 0, err
    assert [Path(p).name for p in lines] == ["tiny.json", "genie_config.json"]
    cfg = json.loads((out / "genie_config.json").read_text())
    bins = cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert bins == ["tiny_prompt_ar4_cl32_1_of_1_qnn.bin", "tiny_token_ar1_cl32_1_of_1_qnn.bin"]
    rep = json.loads((out / "export-report.json").read_text())
    rows = rep["verify"]["genie_config.json"]["rows"]
    runner = Path(__file__).resolve().parents[2] / "tests" / "harness" / "genie_run.py"
    if not runner.exists():
        return
    import sys

    from qhx_export.quant.corpus import tokenize
    from qhx_export.read import open_checkpoint
    from qhx_export.verify.run import qnn_libdir, run_qhx

    ck = open_checkpoint(str(path))
    (ids,) = tokenize([rows[0]["prompt"]], ck.tokenizer_json(), ck.bos_token_id(), 99)
    qhx = run_qhx(qhx_generate(), str(out / "genie_config.json"), ids, 6, None)
    r = subprocess.run(
        [
            sys.executable,
            str(runner),
            str(out / "genie_config.json"),
            "6",
            "--lib-dir",
            qnn_libdir(),
            "--ids",
            ",".join(map(str, ids)),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, LD_LIBRARY_PATH=qnn_libdir()),
    )
    assert r.returncode == 0, r.stderr[-500:]
    doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    assert doc["runs"][0]["output_ids"] == qhx


def test_genie_format_shares_weights_per_split(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--format genie --weight-sharing --genie-splits 2: one binary per split holding its
    prompt (AR 4) and token (AR 1) graphs under Genie's names, the split's weights once (as AI
    Hub's part binaries); the config lists the two parts. qhx_generate refuses the bundle on
    the x86_64 simulator, naming the fix (the simulator cannot load weight-shared binaries)."""
    binary = qhx_generate()
    path = tiny_gguf("llama", name="tiny.gguf")
    out = tmp_path / "g"
    args = [str(path), "-o", str(out), "--arch", "v79", "--ar", "4", "--ctx", "32", "--format", "genie"]
    rc, _, err = export([*args, "--genie-splits", "2", "--weight-sharing"], capsys)
    assert rc == 0, err
    cfg = json.loads((out / "genie_config.json").read_text())
    bins = cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert bins == ["tiny_part_1_of_2.bin", "tiny_part_2_of_2.bin"]
    from qhx_export.verify.run import qnn_libdir

    lib = qnn_libdir()
    inspect = os.path.join(os.path.dirname(binary), "qhx_inspect")
    r = subprocess.run(
        [inspect, "--json", "-", f"{lib}/libQnnSystem.so", *(str(out / b) for b in bins)],
        capture_output=True,
        text=True,
        check=True,
    )
    docs = json.loads(r.stdout)["binaries"]
    for k, d in enumerate(docs, start=1):
        names = sorted(g["name"].rstrip("_") for g in d["graphs"])
        assert names == [f"prompt_ar4_cl32_{k}_of_2", f"token_ar1_cl32_{k}_of_2"], names
        assert all(g["weight_bytes"]["shared"] > 0 for g in d["graphs"]), d["graphs"]
    r = subprocess.run(
        [
            binary,
            str(out / "genie_config.json"),
            f"{lib}/libQnnHtp.so",
            f"{lib}/libQnnSystem.so",
            str(out),
            "4",
            "hi",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr[-400:])
    assert "--no-weight-sharing" in r.stderr.strip().splitlines()[-1], r.stderr[-400:]


def test_w4a16_u8_kv(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """w4a16 (int4 per-channel layers, int8 per-channel lm-head) with --kv-dtype u8: everything on
    the HTP (CPU fallback is disabled at compile), the K/V I/O uint8 with each layer's cache input
    and new rows on one scale/offset in every graph, ids equal to the ORT loop."""
    binary = qhx_generate()
    path = tiny_gguf("qwen2", name="tiny.gguf")
    out = tmp_path / "b"
    args = [str(path), "-o", str(out), "--arch", "v75", "--precision", "w4a16", "--kv-dtype", "u8"]
    rc, _, err = export([*args, "--ar", "4", "--ctx", "48", "--verify", "--verify-tokens", "6"], capsys)
    assert rc in (0, 4), err  # random tiny weights: the threshold is for real ones
    rep = json.loads((out / "export-report.json").read_text())
    (res,) = rep["verify"].values()
    assert all(r["ort_equal"] for r in res["rows"]), res
    from qhx_export.verify.run import qnn_libdir

    inspect = Path(binary).parent / "qhx_inspect"
    if not inspect.exists():
        return
    bins = [str(out / f"tiny_{r}_qnn.bin") for r in ("prefill", "decode", "lmhead")]
    r = subprocess.run(
        [str(inspect), "--json", "-", str(Path(qnn_libdir()) / "libQnnSystem.so"), *bins],
        capture_output=True,
        text=True,
        env=dict(os.environ, LD_LIBRARY_PATH=qnn_libdir()),
    )
    doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    params: dict[str, set[tuple[str, float, int]]] = {}
    for b in doc["binaries"]:
        for t in b["graphs"][0]["inputs"] + b["graphs"][0]["outputs"]:
            if t["name"].startswith(("past_", "new_")):
                key = t["name"].split("_", 1)[1]
                params.setdefault(key, set()).add((t["dtype"], t["quant"]["scale"], t["quant"]["offset"]))
            if t["name"] in ("hidden", "logits"):
                assert t["dtype"] == "UFIXED_POINT_16"
    assert params and all(len(v) == 1 and next(iter(v))[0] == "UFIXED_POINT_8" for v in params.values()), (
        params
    )


def _qhx_json(binary: str, manifest: Path, ids: list[int], n: int, *extra: str) -> dict:
    from qhx_export.verify.run import qnn_libdir

    lib = qnn_libdir()
    ids_file = manifest.parent / "prompt.ids"
    ids_file.write_text(",".join(map(str, ids)))
    r = subprocess.run(
        [
            binary,
            str(manifest),
            f"{lib}/libQnnHtp.so",
            f"{lib}/libQnnSystem.so",
            str(manifest.parent),
            str(n),
            *("--tokens-in", str(ids_file), "--ignore-eos", "--json", "-q", *extra),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, LD_LIBRARY_PATH=lib),
    )
    assert r.returncode == 0, r.stderr[-500:]
    doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    return doc


def test_verify_graph_runs_speculation_and_is_estimated(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--verify-rows: a quantized k-row graph over the decode cache in the bundle, sharing the
    cache's quantization (qhx_generate refuses to load it otherwise); greedy ids equal to the
    ORT loop, with and without --spec lookup. --estimate-verify adds the verify-k / decode cost
    table without writing those graphs."""
    binary = qhx_generate()
    path = tiny_gguf("qwen2", name="tiny.gguf")
    out = tmp_path / "b"
    args = [str(path), "-o", str(out), "--arch", "v79", "--precision", "w8a16", "--ar", "6", "--ctx", "48"]
    rc, lines, err = export([*args, "--verify-rows", "4", "--estimate", "--estimate-verify", "2,4"], capsys)
    assert rc == 0, err
    man_path = Path(lines[-1])
    man = json.loads(man_path.read_text())
    assert set(man["artifacts"]["contexts"]) == {"prefill", "verify", "decode", "lmhead"}
    assert not list(out.glob("*est_verify*")), "estimate-only graphs must not be written"
    ver = json.loads((out / "export-report.json").read_text())["estimate"]["verify_vs_decode"]
    assert list(ver) == ["2", "4"] and all(
        v["us"] > 0 and v["cost_in_decode_steps"] > 0 for v in ver.values()
    )
    # 9 prompt tokens: 6 through the prefill, the last 3 through the verify graph (qhx's plan and
    # the ORT loop alike), so the ids check the verify graph's binding against the same binaries
    ids = [5, 9, 13, 17, 21, 25, 5, 9, 13]
    plain = _qhx_json(binary, man_path, ids, 8)
    from qhx_export.verify.loop import load_bundle

    assert plain["output_ids"] == load_bundle(str(man_path)).generate(ids, 8)
    spec = _qhx_json(binary, man_path, ids, 8, "--spec", "lookup", "--spec-adaptive", "off")
    assert spec["output_ids"] == plain["output_ids"]


def test_estimate_only_writes_the_report_alone(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tiny_gguf("llama", name="tiny.gguf")
    out = tmp_path / "e"
    args = [str(path), "-o", str(out), "--prefill", "none", "--ctx", "32", "--estimate-only"]
    from qhx_export.compile.estimate import ms, rate

    rc, lines, err = export([*args, "--estimate-verify", "3"], capsys)
    assert rc == 0, err
    assert lines[-1] == str(out / "export-report.json")
    assert sorted(p.name for p in out.iterdir()) == [".qhx-export.json", "README.md", "export-report.json"]
    est = json.loads(Path(lines[-1]).read_text())["estimate"]
    assert est["decode_ms_per_token"] > 0 and list(est["verify_vs_decode"]) == ["3"]
    # readable: one line per graph and a summary, the same numbers in the report and README
    assert "{'" not in err and '{"' not in err
    dec = est["graphs"]["decode"]
    assert dec["ms"] == round(dec["us"] / 1000, 3)
    assert f"estimate decode {ms(dec['us'])} ms ({ms(dec['lower_us'])}-{ms(dec['upper_us'])})" in err
    t = est["decode_ms_per_token"]
    assert est["summary"].startswith(f"decode {ms(t * 1000)} ms/token ({rate(1000 / t)} tok/s")
    assert f"{est['weight_bytes_per_token'] / 1e6:,.1f} MB of weights per token" in est["summary"]
    assert f"qhx-export: estimate: {est['summary']}" in err
    readme = (out / "README.md").read_text()
    assert est["summary"] in readme and f"- decode {ms(dec['us'])} ms" in readme


def _io_dims(binary: str, binf: Path) -> dict[str, list[int]]:
    """{tensor: dims} of a context binary's graph I/O, as qhx_inspect reads them."""
    from qhx_export.verify.run import qnn_libdir

    inspect = Path(binary).parent / "qhx_inspect"
    if not inspect.exists():
        pytest.skip("qhx_inspect not built")
    r = subprocess.run(
        [str(inspect), "--json", "-", str(Path(qnn_libdir()) / "libQnnSystem.so"), str(binf)],
        capture_output=True,
        text=True,
        env=dict(os.environ, LD_LIBRARY_PATH=qnn_libdir()),
    )
    assert r.returncode == 0, r.stderr[-500:]
    doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    (graph,) = doc["binaries"][0]["graphs"]
    return {t["name"]: t["dims"] for t in graph["inputs"] + graph["outputs"]}


def test_head_major_kv(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--kv-layout head_major on the HTP: the context binaries' K/V I/O is [n_kv, rows, Dh]
    (n_kv = 2, so the layouts differ in memory), and qhx_generate runs the bundle through a chunked
    prefill over the cache and decode steps with ids equal to the ORT loop's and to those of the
    same model exported position-major."""
    binary = qhx_generate()
    path = tiny_gguf("llama", name="tiny.gguf")
    base = [str(path), "--arch", "v79", "--prefill", "past", "--ar", "4", "--ctx", "32"]
    mans = {}
    for layout in ("head_major", "pos_major"):
        rc, lines, err = export([*base, "-o", str(tmp_path / layout), "--kv-layout", layout], capsys)
        assert rc == 0, err
        mans[layout] = Path(lines[-1])
    man = json.loads(mans["head_major"].read_text())
    assert man["source"]["real"]["kv_layout"] == "head_major"
    dh = man["params"]["head_dim"]
    assert man["params"]["n_kv_heads"] == 2
    for role, rows in (("decode", 1), ("prefill", 4)):
        dims = _io_dims(binary, mans["head_major"].parent / man["artifacts"]["contexts"][role]["bin"])
        kv = {n: d for n, d in dims.items() if n.startswith(("past_", "new_"))}
        assert kv and kv == {n: [2, 32 if n.startswith("past_") else rows, dh] for n in kv}, kv
    pos = json.loads(mans["pos_major"].read_text())
    dims = _io_dims(binary, mans["pos_major"].parent / pos["artifacts"]["contexts"]["decode"]["bin"])
    assert dims["past_k_0"] == [32, 2 * dh] and dims["new_k_0"] == [1, 2 * dh]
    from qhx_export.verify.loop import load_bundle

    ids = [5, 9, 13, 17, 21, 25, 29, 33, 37]  # prefill chunks of 4, 4, 1 over the cache
    got = _qhx_json(binary, mans["head_major"], ids, 8)["output_ids"]
    assert got == load_bundle(str(mans["head_major"])).generate(ids, 8)
    assert got == _qhx_json(binary, mans["pos_major"], ids, 8)["output_ids"]


def test_w8a16_chunked_prefill_calibrates_on_a_filled_cache(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--prefill past at w8a16: the chunked prefill's calibration includes chunks reading the
    cache (each sequence in two chunks). Calibrated from an empty cache alone, the scores against
    the cache got no range and clipped: 50 % agreement here (this model's random weights leave
    near-ties: 93.8 % with the fix), 6 % -> 100 % on the parity suite's tiny Llama-3."""
    qhx_generate()
    path = tiny_gguf("llama", name="tiny.gguf")
    out = tmp_path / "b"
    args = [str(path), "-o", str(out), "--arch", "v75", "--precision", "w8a16", "--prefill", "past"]
    args += ["--ar", "4", "--ctx", "48", "--calib-steps", "64", "--verify", "--verify-tokens", "8"]
    rc, _, err = export([*args, "--no-ort-check"], capsys)
    assert rc in (0, 4), err
    (res,) = json.loads((out / "export-report.json").read_text())["verify"].values()
    assert res["mean"] >= 0.9, res


def test_ctx_ladder_crosses_rungs_with_the_ort_loop_and_shares_weights(
    tmp_path: Path, tiny_gguf: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--ctx-ladder 16,48 with a chunked prefill and a verify graph per rung (W8A16): qhx_generate
    starts on the 16-slot rung and moves up as the run grows, with ids equal to the ORT loop on
    the same schedule, with and without --spec lookup; the cache moves byte for byte (every
    rung shares the K/V encodings). The same export weight-shared is one context binary holding
    all 7 graphs with the weights once (size about one rung's), which qhx_inspect reports and
    the x86_64 simulator refuses with the fix named (it cannot load one)."""
    binary = qhx_generate()
    path = tiny_gguf("qwen2", name="tiny.gguf")
    args = [str(path), "--arch", "v79", "--precision", "w8a16", "--ar", "6", "--prefill", "past"]
    args += ["--verify-rows", "4", "--ctx-ladder", "16,48"]
    rc, lines, err = export([*args, "-o", str(tmp_path / "plain"), "--no-weight-sharing"], capsys)
    assert rc == 0, err
    man_path = Path(lines[-1])
    man = json.loads(man_path.read_text())
    assert man["schema_version"] == 2
    steps = [(s["role"], s["bin"]) for s in man["plan"]["steps"]]
    assert steps == [
        ("prefill", "tiny_prefill_c16_qnn.bin"),
        ("verify", "tiny_verify_c16_qnn.bin"),
        ("decode", "tiny_decode_c16_qnn.bin"),
        ("prefill", "tiny_prefill_qnn.bin"),
        ("verify", "tiny_verify_qnn.bin"),
        ("decode", "tiny_decode_qnn.bin"),
        ("head", "tiny_lmhead_qnn.bin"),
    ]
    real = man["source"]["real"]["graphs"]
    for k in ("decode", "verify", "prefill"):  # rungs share the K/V I/O encodings
        kv = {n: q for n, q in real[k]["quant"].items() if n.startswith(("past_", "new_"))}
        assert kv and all(real[f"{k}@16"]["quant"][n] == q for n, q in kv.items()), k
    from qhx_export.verify.loop import load_bundle

    loop = load_bundle(str(man_path))
    # 9 prompt ids (6 through the 16-rung prefill, 3 through its verify graph), 20 generated:
    # the decode cache fills the 16 slots and moves to the 48 rung at position 16
    ids = [5, 9, 13, 17, 21, 25, 5, 9, 13]
    got = _qhx_json(binary, man_path, ids, 20)
    assert got["stats"]["ctx_rung"] == 48 and got["stats"]["rung_moves"] == 1, got["stats"]
    want = loop.generate(ids, 20)
    assert got["output_ids"] == want
    short = _qhx_json(binary, man_path, ids, 3)
    assert short["stats"]["ctx_rung"] == 16 and short["stats"]["rung_moves"] == 0
    # a repeating prompt so that prompt lookup drafts, across the move too (on some other
    # prompts of this random model qhx and the ORT loop part at a near-tie, with or without a
    # ladder: a known gap, see the README)
    rep = [5, 9, 13, 17, 21, 25, 5, 9, 13, 17, 21, 25]
    spec = _qhx_json(binary, man_path, rep, 24, "--spec", "lookup", "--spec-adaptive", "off")
    assert spec["output_ids"] == _qhx_json(binary, man_path, rep, 24)["output_ids"]
    assert spec["output_ids"] == loop.generate_spec(rep, 24, 8)[0]
    assert spec["spec"]["verifies"] > 0, spec["spec"]

    rc, lines, err = export([*args, "-o", str(tmp_path / "shared"), "--weight-sharing"], capsys)
    assert rc == 0, err
    shared = Path(lines[-1])
    man = json.loads(shared.read_text())
    assert {s["bin"] for s in man["plan"]["steps"]} == {"tiny_qnn.bin"}
    graphs = {s["graph"] for s in man["plan"]["steps"]}
    assert len(graphs) == 7
    from qhx_export.verify.run import qnn_libdir

    lib = qnn_libdir()
    inspect = os.path.join(os.path.dirname(binary), "qhx_inspect")

    def graphs_of(*bins: Path) -> list[dict]:
        cmd = [inspect, "--json", "-", f"{lib}/libQnnSystem.so", *map(str, bins)]
        r = subprocess.run(cmd, capture_output=True, text=True, check=True)
        return [g for b in json.loads(r.stdout)["binaries"] for g in b["graphs"]]

    doc = graphs_of(shared.parent / "tiny_qnn.bin")
    assert {g["name"] for g in doc} == graphs
    layer_graphs = [g for g in doc if g["role"] != "lm-head"]
    assert len(layer_graphs) == 6 and all(g["weight_bytes"]["own"] == 0 for g in layer_graphs), doc
    # stored once: the context's shared weights are one layer graph's plus the lm-head's (as
    # the graphs compiled alone hold them), not the six layer graphs'
    pool = {g["weight_bytes"]["shared"] for g in doc}
    assert len(pool) == 1, doc
    plain = {f.name: graphs_of(f)[0]["weight_bytes"]["own"] for f in (tmp_path / "plain").glob("*_qnn.bin")}
    once = plain["tiny_decode_qnn.bin"] + plain["tiny_lmhead_qnn.bin"]
    assert once <= pool.pop() <= 1.1 * once, (pool, plain)
    assert sum(plain.values()) > 4 * once, plain
    r = subprocess.run(
        [binary, str(shared), f"{lib}/libQnnHtp.so", f"{lib}/libQnnSystem.so", str(shared.parent), "4", "hi"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr[-400:])
    (line,) = r.stderr.strip().splitlines()
    assert "share" in line and "--no-weight-sharing" in line, line
