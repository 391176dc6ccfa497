#!/usr/bin/env python3
"""Write tokenizer.json built from a GGUF's tokenizer metadata (metadata only: works on a
truncated or split GGUF).   gguf_tokenizer.py GGUF OUT.json"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_meta  # noqa: E402
import make_bundle as mb  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 1
    try:
        tok = mb.build_tokenizer(gguf_meta.MetaModel(sys.argv[1]))
    except (gguf_meta.MetaError, mb.BundleError, OSError) as e:
        print(f"gguf_tokenizer: error: {e}", file=sys.stderr)
        return 1
    with mb.atomic_open(sys.argv[2]) as f:
        f.write(json.dumps(tok, ensure_ascii=False, indent=1).encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
