#!/usr/bin/env python3
"""Run Qualcomm's libGenie.so (from the onnxruntime-qnn wheel) on a Genie bundle, through its C
API (GenieDialogConfig_createFromJson, GenieDialog_create, GenieDialog_tokenQuery /
GenieDialog_query, GenieDialog_free, GenieDialogConfig_free), with ctypes:

    LD_LIBRARY_PATH=$(scripts/qnn-libs.sh) genie_run.py BUNDLE_DIR/genie_config.json N \\
        (--ids 1,2,3 | --text 'prompt' | --golden G.json ...) [--dump DIR] [--log info|verbose]

prints one JSON document: per prompt the input ids, Genie's generated ids, load ms, TTFT ms,
decode tok/s and per-token callback times. Generation stops after N tokens (the config's
dialog.max-num-tokens is set to N in memory), at EOS, or when the context is full.

The config is read from the file and its relative paths are resolved against its directory
(Genie itself resolves them against the process's working directory, so the harness changes
into the bundle directory while Genie runs). --dump sets dialog.debug{path, dump-outputs} so
Genie writes each step's logits there.

Anything Genie or the QNN libraries print on stdout is sent to stderr; stdout carries the JSON.
"""
from __future__ import annotations

import argparse
import ctypes as C
import json
import os
import sys
import time

GENIE_DIALOG_SENTENCE_COMPLETE = 0
TOKEN_CB = C.CFUNCTYPE(None, C.POINTER(C.c_uint32), C.c_uint32, C.c_int, C.c_void_p)
TEXT_CB = C.CFUNCTYPE(None, C.c_char_p, C.c_int, C.c_void_p)
LOG_CB = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p, C.c_int, C.c_uint64, C.c_void_p)
LEVELS = {"error": 1, "warn": 2, "info": 3, "verbose": 4}


class Genie:
    def __init__(self, lib_dir: str, log_level: str | None):
        self.lib = C.CDLL(os.path.join(lib_dir, "libGenie.so"))
        L = self.lib
        vp = C.c_void_p
        L.GenieDialogConfig_createFromJson.argtypes = [C.c_char_p, C.POINTER(vp)]
        L.GenieDialog_create.argtypes = [vp, C.POINTER(vp)]
        L.GenieDialog_tokenQuery.argtypes = [vp, C.POINTER(C.c_uint32), C.c_uint32, C.c_int, TOKEN_CB, vp]
        L.GenieDialog_query.argtypes = [vp, C.c_char_p, C.c_int, TEXT_CB, vp]
        L.GenieDialog_reset.argtypes = [vp]
        L.GenieDialog_free.argtypes = [vp]
        L.GenieDialogConfig_free.argtypes = [vp]
        for f in ("GenieDialogConfig_createFromJson", "GenieDialog_create", "GenieDialog_tokenQuery",
                  "GenieDialog_query", "GenieDialog_reset", "GenieDialog_free", "GenieDialogConfig_free"):
            getattr(L, f).restype = C.c_int32
        self.log = None
        self.log_lines = []
        if log_level:
            libc = C.CDLL(None)
            libc.vsnprintf.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, C.c_void_p]

            def on_log(_h, fmt, level, _ts, va):
                # va_list is an array type on x86_64 SysV: the callback receives a pointer to it.
                try:
                    buf = C.create_string_buffer(4096)
                    libc.vsnprintf(buf, 4096, fmt, va)
                    line = buf.value.decode("utf-8", "replace").rstrip()
                    self.log_lines.append(line)
                    print(f"genie[{level}]: {line}", file=sys.stderr, flush=True)
                except Exception:  # noqa: BLE001  (nothing may raise into C)
                    pass
            self._log_cb = LOG_CB(on_log)
            L.GenieLog_create.argtypes = [vp, LOG_CB, C.c_int, C.POINTER(vp)]
            L.GenieLog_create.restype = C.c_int32
            L.GenieDialogConfig_bindLogger.argtypes = [vp, vp]
            L.GenieDialogConfig_bindLogger.restype = C.c_int32
            h = vp()
            st = L.GenieLog_create(None, self._log_cb, LEVELS[log_level], C.byref(h))
            if st != 0:
                raise SystemExit(f"genie_run: error: GenieLog_create failed ({st})")
            self.log = h

    def create(self, cfg_json: str):
        L = self.lib
        cfg = C.c_void_p()
        st = L.GenieDialogConfig_createFromJson(cfg_json.encode(), C.byref(cfg))
        if st != 0:
            raise SystemExit(f"genie_run: error: GenieDialogConfig_createFromJson failed ({st})")
        if self.log is not None:
            L.GenieDialogConfig_bindLogger(cfg, self.log)
        dlg = C.c_void_p()
        st = L.GenieDialog_create(cfg, C.byref(dlg))
        if st != 0:
            L.GenieDialogConfig_free(cfg)
            raise SystemExit(f"genie_run: error: GenieDialog_create failed ({st})")
        return cfg, dlg

    def token_query(self, dlg, ids: list[int]) -> dict:
        got, times, codes = [], [], []

        def on_tokens(ptr, n, code, _ud):
            try:
                now = time.perf_counter()
                for i in range(n):
                    got.append(int(ptr[i]))
                    times.append(now)
                codes.append(code)
            except Exception:  # noqa: BLE001
                pass
        cb = TOKEN_CB(on_tokens)
        arr = (C.c_uint32 * len(ids))(*ids)
        t0 = time.perf_counter()
        st = self.lib.GenieDialog_tokenQuery(dlg, arr, len(ids), GENIE_DIALOG_SENTENCE_COMPLETE, cb, None)
        t1 = time.perf_counter()
        return {"status": st, "ids": got, "t0": t0, "t_end": t1, "times": times, "codes": codes}

    def text_query(self, dlg, text: str) -> dict:
        out, times, codes = [], [], []

        def on_text(s, code, _ud):
            try:
                out.append(s.decode("utf-8", "replace") if s else "")
                times.append(time.perf_counter())
                codes.append(code)
            except Exception:  # noqa: BLE001
                pass
        cb = TEXT_CB(on_text)
        t0 = time.perf_counter()
        st = self.lib.GenieDialog_query(dlg, text.encode(), GENIE_DIALOG_SENTENCE_COMPLETE, cb, None)
        return {"status": st, "pieces": out, "t0": t0, "t_end": time.perf_counter(), "times": times, "codes": codes}


def load_config(path: str, n_tokens: int, dump: str | None) -> tuple[str, dict]:
    cfg = json.load(open(path, encoding="utf-8"))
    d = cfg["dialog"]
    d["max-num-tokens"] = n_tokens
    if dump:
        os.makedirs(dump, exist_ok=True)
        d["debug"] = {"path": os.path.abspath(dump), "dump-outputs": True}
        for k in os.environ.get("QHX_GENIE_DEBUG", "").split(","):
            if k:  # extra dialog.debug flags, e.g. dump-specs,dump-tensors
                d["debug"][k] = True
    return os.path.dirname(os.path.abspath(path)), cfg


def stats(r: dict, n_prompt: int) -> dict:
    ts = r["times"]
    out = {"status": r["status"], "prompt_tokens": n_prompt, "generated": len(ts),
           "total_ms": round((r["t_end"] - r["t0"]) * 1e3, 2)}
    if ts:
        out["ttft_ms"] = round((ts[0] - r["t0"]) * 1e3, 2)
        out["step_ms"] = [round((b - a) * 1e3, 2) for a, b in zip(ts, ts[1:])]
        if len(ts) > 1:
            out["tok_s"] = round((len(ts) - 1) / (ts[-1] - ts[0]), 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("n_tokens", type=int)
    ap.add_argument("--ids", action="append", default=[], help="comma-separated prompt ids (repeatable)")
    ap.add_argument("--text", action="append", default=[], help="text prompt for GenieDialog_query (repeatable)")
    ap.add_argument("--golden", action="append", default=[], help="golden JSON: its input_ids are a prompt")
    ap.add_argument("--lib-dir", default=os.environ.get("QHX_QNN_LIBS"))
    ap.add_argument("--dump", help="dialog.debug path: Genie dumps each step's outputs there")
    ap.add_argument("--log", choices=sorted(LEVELS))
    ap.add_argument("--no-reset", action="store_true", help="keep the dialog between prompts (multi-turn)")
    a = ap.parse_args()
    if not a.lib_dir:
        ap.error("--lib-dir (or QHX_QNN_LIBS) must name the directory of libGenie.so")
    prompts = [("ids", [int(t) for t in s.split(",")], None) for s in a.ids]
    bos = json.load(open(a.config, encoding="utf-8"))["dialog"]["context"].get("bos-token")
    for g in a.golden:
        gd = json.load(open(g, encoding="utf-8"))
        ids = list(gd["input_ids"])
        if bos is not None and ids[:1] == [bos]:
            ids = ids[1:]  # Genie prepends the config's bos-token to a dialog's first query itself
        prompts.append(("ids", ids, os.path.basename(g)))
    prompts += [("text", t, None) for t in a.text]

    real_stdout = os.dup(1)
    os.dup2(2, 1)  # whatever the libraries print goes to stderr
    try:
        root, cfg = load_config(a.config, a.n_tokens, a.dump)
        genie = Genie(a.lib_dir, a.log)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            t0 = time.perf_counter()
            hcfg, dlg = genie.create(json.dumps(cfg))
            load_ms = (time.perf_counter() - t0) * 1e3
            runs = []
            for kind, p, label in prompts:
                if kind == "ids":
                    r = genie.token_query(dlg, p)
                    ent = {"input_ids": p, "output_ids": r["ids"], **stats(r, len(p))}
                else:
                    r = genie.text_query(dlg, p)
                    ent = {"prompt": p, "pieces": r["pieces"], "text": "".join(r["pieces"]), **stats(r, -1)}
                if label:
                    ent["golden"] = label
                ent["codes"] = sorted(set(r["codes"]))
                runs.append(ent)
                if not a.no_reset:
                    genie.lib.GenieDialog_reset(dlg)
            genie.lib.GenieDialog_free(dlg)
            genie.lib.GenieDialogConfig_free(hcfg)
        finally:
            os.chdir(cwd)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
    doc = {"runtime": "libGenie.so", "config": os.path.abspath(a.config), "n_tokens": a.n_tokens,
           "load_ms": round(load_ms, 2), "runs": runs}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
