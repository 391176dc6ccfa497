//! Write seed corpora for every target into `<dir>/<target>/` (default `corpus/`).

use qnn_emu::writer::{write_bundle, SynthSpec};
use std::path::{Path, PathBuf};

fn put(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(name), bytes).unwrap();
}

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let specs = [
        (
            "null",
            SynthSpec {
                null_compute: true,
                ..Default::default()
            },
        ),
        (
            "u16hm",
            SynthSpec {
                null_compute: true,
                io: "ufixed16".into(),
                head_major: true,
                ..Default::default()
            },
        ),
        (
            "noprefill",
            SynthSpec {
                null_compute: true,
                prefill: None,
                embed_f16: true,
                ..Default::default()
            },
        ),
        (
            "weights",
            SynthSpec {
                hidden: 16,
                n_heads: 2,
                n_kv_heads: 1,
                ffn: 16,
                n_layers: 1,
                ..Default::default()
            },
        ),
    ];
    let tmp = std::env::temp_dir().join(format!("qhx-fuzz-seeds-{}", std::process::id()));
    for (tag, spec) in specs {
        let d = tmp.join(tag);
        std::fs::create_dir_all(&d).unwrap();
        let m = write_bundle(&d, &spec).unwrap();
        put(
            &out,
            "manifest",
            &format!("{tag}.json"),
            &std::fs::read(&m).unwrap(),
        );
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".bin") && !name.contains("embed") {
                let b = std::fs::read(&p).unwrap();
                put(&out, "emu_format", &format!("{tag}-{name}"), &b);
                put(&out, "binary_info", &format!("{tag}-{name}"), &b);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    // embed: [dtype, vocab u32 le, hidden u32 le] + table.
    for (dt, vocab, hidden) in [(0u8, 4u32, 3u32), (1, 2, 5), (1, 0, 0)] {
        let es = if dt == 0 { 2 } else { 4 };
        let mut b = vec![dt];
        b.extend(vocab.to_le_bytes());
        b.extend(hidden.to_le_bytes());
        b.extend((0..vocab * hidden * es).map(|i| (i * 37) as u8));
        put(&out, "embed", &format!("t{dt}-{vocab}x{hidden}"), &b);
    }
    for (i, p) in [
        "\x03The capital of France is",
        "\x00hi",
        "\x01<|bos|>a<|eos|>b",
        "\x02caf\u{e9} \u{1F600} \u{4E2D}\u{6587}",
    ]
    .iter()
    .enumerate()
    {
        put(&out, "prompt", &format!("p{i}"), p.as_bytes());
    }
    for (i, body) in [
        "\x00{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
        "\x00{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\"}]}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"required\"}",
        "\x00{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"content\":\"1\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\"}}}}",
        "\x01{\"prompt\":\"The capital of France is\",\"max_tokens\":8,\"temperature\":0.7,\"top_p\":0.9,\"seed\":-3,\"stop\":[\"\\n\"]}",
        "\x01{\"prompt\":[1,2,3]}",
    ]
    .iter()
    .enumerate()
    {
        put(&out, "server_request", &format!("r{i}"), body.as_bytes());
    }
    // genie_config: 8 header bytes (graph shape, see qhx_fuzz::GenieShape) + config text.
    // Header [layers, n_kv, head_dim, vocab, cl, variants/splits, perturb, at]: head_dim
    // index 1 is 8, index 2 is 16; configs with kv-dim 8 / 16 / none match their header.
    let full = |kv: &str| {
        format!(
            r#"{{"dialog": {{"version": 1, "type": "basic", "max-num-tokens": 200,
  "stop-sequence": ["</s>"],
  "context": {{"version": 1, "size": 64, "n-vocab": 100, "bos-token": 1, "eos-token": [2, 3],
               "eot-token": 4, "pad-token": 0}},
  "tokenizer": {{"version": 1, "path": "tokenizer.json"}},
  "sampler": {{"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, "top-p": 0.95,
               "token-penalty": {{"penalize-last-n": 32, "repetition-penalty": 1.1}}}},
  "engine": {{"version": 1, "n-threads": 3,
    "backend": {{"version": 1, "type": "QnnHtp",
      "QnnHtp": {{"version": 1, "spill-fill-bufsize": 0, "use-mmap": true, "mmap-budget": 0,
                  "poll": true, "cpu-mask": "0xe0"{kv}, "allow-async-init": false}}}},
    "model": {{"version": 1, "type": "binary",
      "binary": {{"version": 1, "ctx-bins": ["a.bin", "b.bin"]}},
      "positional-encoding": {{"type": "rope", "rope-dim": 4, "rope-theta": 500000,
        "rope-scaling": {{"rope-type": "llama3", "factor": 8.0, "low-freq-factor": 1.0,
          "high-freq-factor": 4.0, "original-max-position-embeddings": 8192}}}}}}}}}}}}"#
        )
    };
    let minimal = r#"{"dialog": {"version": 1, "type": "basic",
  "context": {"version": 1, "size": 32, "n-vocab": 50, "bos-token": 1, "eos-token": 2},
  "tokenizer": {"version": 1, "path": "t.json"},
  "engine": {"version": 1, "n-threads": 1,
    "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1}},
    "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": ["m.bin"]}}}}}"#;
    for (name, header, text) in [
        (
            "full-kv8",
            [1u8, 1, 1, 84, 2, 1 | 4 << 2, 0, 0],
            full(r#", "kv-dim": 8"#),
        ),
        (
            "full-kv16",
            [2, 3, 2, 200, 3, 2 | 2 << 2, 0, 1],
            full(r#", "kv-dim": 16"#),
        ),
        ("full-nokv", [0, 0, 0, 0, 0, 0, 0, 2], full("")),
        (
            "min-dim",
            [1, 1, 1, 34, 1, 1 | 1 << 2, 128, 5],
            minimal.to_string(),
        ),
        ("min-name", [0, 1, 2, 34, 1, 4, 130, 9], minimal.to_string()),
        (
            "min-drop",
            [2, 2, 3, 34, 2, 2 | 3 << 2, 132, 17],
            minimal.to_string(),
        ),
    ] {
        let mut b = header.to_vec();
        b.extend(text.as_bytes());
        put(&out, "genie_config", name, &b);
    }
    println!("seeds written to {}", out.display());
}
