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
    println!("seeds written to {}", out.display());
}
