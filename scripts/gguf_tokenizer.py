#!/usr/bin/env python3
"""Write tokenizer.json built from a GGUF's tokenizer metadata (metadata only: works on a
truncated or split GGUF).   gguf_tokenizer.py GGUF OUT.json

Byte-level BPE ("gpt2") and Gemma's SentencePiece vocabulary ("llama" in a gemma* GGUF), by the
exporter package's converter (export/qhx_export/tokenizer.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "export"))
import gguf_meta  # noqa: E402
from qhx_export import ExportError  # noqa: E402
from qhx_export.tokenizer import tokenizer_json_bytes  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 1
    src, out = sys.argv[1:]
    try:
        data = tokenizer_json_bytes(gguf_meta.read_metadata(src), src)
        with open(out + ".tmp", "wb") as f:
            f.write(data)
        os.replace(out + ".tmp", out)
    except (gguf_meta.MetaError, ExportError, OSError) as e:
        print(f"gguf_tokenizer: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
