//! Bad-input catalogue: every case must end with a one-line error that names the file,
//! graph, tensor or field at fault, exit code 1 or 2, no panic, and nothing on stdout.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

struct Case {
    name: &'static str,
    /// Positional args after the program: manifest, backend, system, root, n, prompt.
    args: Vec<OsString>,
    env: Vec<(&'static str, String)>,
    code: i32,
    needles: Vec<&'static str>,
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// A fresh copy of the tiny bundle for one case.
fn fresh(tag: &str) -> (PathBuf, PathBuf) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    bundle(&format!("bad-{n:02}-{tag}"), &SynthSpec::default())
}

fn std_args(m: &Path, root: &Path, n: &str, prompt: &str) -> Vec<OsString> {
    let lib = emu().display().to_string();
    os(vec![
        m.display().to_string(),
        lib.clone(),
        lib,
        root.display().to_string(),
        n.into(),
        prompt.into(),
    ])
}

fn os(v: Vec<String>) -> Vec<OsString> {
    v.into_iter().map(OsString::from).collect()
}

fn manifest_case(
    name: &'static str,
    f: impl FnOnce(&mut serde_json::Value),
    needles: Vec<&'static str>,
) -> Case {
    let (d, m) = fresh(name);
    edit_json(&m, f);
    Case {
        name,
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles,
    }
}

fn remove(v: &mut serde_json::Value, path: &[&str]) {
    let mut cur = v;
    for k in &path[..path.len() - 1] {
        cur = cur.get_mut(*k).unwrap();
    }
    cur.as_object_mut().unwrap().remove(path[path.len() - 1]);
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    let lib = emu().display().to_string();

    // --- libraries ---
    let (d, m) = fresh("libpath");
    v.push(Case {
        name: "backend library path does not exist",
        args: os(vec![
            m.display().to_string(),
            "/nonexistent/libQnnHtp.so".into(),
            lib.clone(),
            d.display().to_string(),
            "4".into(),
            "hi".into(),
        ]),
        env: vec![],
        code: 1,
        needles: vec!["/nonexistent/libQnnHtp.so"],
    });
    let (d, m) = fresh("syspath");
    v.push(Case {
        name: "system library path does not exist",
        args: os(vec![
            m.display().to_string(),
            lib.clone(),
            "/nonexistent/libQnnSystem.so".into(),
            d.display().to_string(),
            "4".into(),
            "hi".into(),
        ]),
        env: vec![],
        code: 1,
        needles: vec!["/nonexistent/libQnnSystem.so"],
    });
    let (d, m) = fresh("notlib");
    v.push(Case {
        name: "backend path is not a library",
        args: os(vec![
            m.display().to_string(),
            m.display().to_string(),
            lib.clone(),
            d.display().to_string(),
            "4".into(),
            "hi".into(),
        ]),
        env: vec![],
        code: 1,
        needles: vec!["tiny.json"],
    });
    let (d, m) = fresh("nosym");
    // This build's own architecture: a multiarch host can hold several (x86_64 and arm64
    // under qemu), and a foreign libm fails to load before any symbol lookup.
    let arch = std::env::consts::ARCH;
    let libc = [
        format!("/lib/{arch}-linux-gnu/libm.so.6"),
        format!("/usr/lib/{arch}-linux-gnu/libm.so.6"),
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .unwrap_or_else(|| format!("/lib/{arch}-linux-gnu/libm.so.6"));
    v.push(Case {
        name: "library without the QNN symbol",
        args: os(vec![
            m.display().to_string(),
            libc,
            lib.clone(),
            d.display().to_string(),
            "4".into(),
            "hi".into(),
        ]),
        env: vec![],
        code: 1,
        needles: vec!["QnnInterface_getProviders", "libm"],
    });
    for (name, ver) in [
        ("backend reports API 1.x", "1.15.0"),
        ("backend reports API 2.7", "2.7.2"),
    ] {
        let (d, m) = fresh(if ver.starts_with('1') {
            "api1"
        } else {
            "api27"
        });
        v.push(Case {
            name,
            args: std_args(&m, &d, "4", "hi"),
            env: vec![("QNN_EMU_CORE_API", ver.into())],
            code: 1,
            needles: vec!["libqnn_emu", ver, "2.10"],
        });
    }
    let (d, m) = fresh("sysapi");
    v.push(Case {
        name: "system library reports API 0.x",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![("QNN_EMU_SYSTEM_API", "0.9.0".into())],
        code: 1,
        needles: vec!["system API 0.9.0"],
    });

    // --- paths and arguments ---
    let (d, _) = fresh("nomanifest");
    v.push(Case {
        name: "missing manifest file",
        args: std_args(&d.join("absent.json"), &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["absent.json"],
    });
    let (_d, m) = fresh("rootfile");
    v.push(Case {
        name: "artifacts_root is not a directory",
        args: std_args(&m, &m, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["artifacts root", "tiny.json"],
    });
    for (tag, n, needle) in [
        ("n0", "0", "at least 1"),
        ("nneg", "-3", "-3"),
        ("nword", "many", "many"),
        ("nhuge", "99999999999", "99999999999"),
    ] {
        let (d, m) = fresh(tag);
        v.push(Case {
            name: "bad n_tokens",
            args: std_args(&m, &d, n, "hi"),
            env: vec![],
            code: 2,
            needles: vec![needle],
        });
    }
    let (d, m) = fresh("noprompt");
    let mut a = std_args(&m, &d, "4", "hi");
    a.pop();
    v.push(Case {
        name: "no prompt",
        args: a,
        env: vec![],
        code: 2,
        needles: vec!["prompt"],
    });

    // --- manifest content ---
    let (d, m) = fresh("empty");
    std::fs::write(&m, "").unwrap();
    v.push(Case {
        name: "empty manifest",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny.json", "empty"],
    });
    let (d, m) = fresh("notjson");
    std::fs::write(&m, "this is { not json").unwrap();
    v.push(Case {
        name: "manifest is not JSON",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny.json", "line 1"],
    });
    v.push(manifest_case(
        "schema",
        |j| j["schema_version"] = 7.into(),
        vec!["schema_version", "7"],
    ));
    for field in [
        "hidden",
        "vocab",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "head_dim",
        "max_ctx",
        "rope_theta",
        "eos_token_id",
    ] {
        v.push(manifest_case(
            "missing param",
            move |j| remove(j, &["params", field]),
            vec!["params", field],
        ));
    }
    v.push(manifest_case(
        "missing artifacts",
        |j| remove(j, &["artifacts"]),
        vec!["artifacts"],
    ));
    v.push(manifest_case(
        "missing tokenizer field",
        |j| remove(j, &["artifacts", "tokenizer"]),
        vec!["artifacts", "tokenizer"],
    ));
    v.push(manifest_case(
        "missing lmhead",
        |j| remove(j, &["artifacts", "contexts", "lmhead"]),
        vec!["contexts", "lmhead"],
    ));
    v.push(manifest_case(
        "missing decode",
        |j| remove(j, &["artifacts", "contexts", "decode"]),
        vec!["contexts", "decode"],
    ));
    v.push(manifest_case(
        "wrong type",
        |j| j["params"]["hidden"] = "32".into(),
        vec!["params.hidden"],
    ));
    v.push(manifest_case(
        "negative dim",
        |j| j["params"]["n_heads"] = (-4).into(),
        vec!["params.n_heads"],
    ));
    v.push(manifest_case(
        "zero dim",
        |j| j["params"]["head_dim"] = 0.into(),
        vec!["params.head_dim"],
    ));
    v.push(manifest_case(
        "unknown arch",
        |j| j["model"]["arch"] = "mamba".into(),
        vec!["model.arch", "mamba"],
    ));
    v.push(manifest_case(
        "vocab vs embed size",
        |j| j["params"]["vocab"] = 300.into(),
        vec!["tiny_embed_f32.bin", "vocab 300"],
    ));
    v.push(manifest_case(
        "hidden vs graph dims",
        |j| j["params"]["hidden"] = 40.into(),
        vec!["tiny_embed_f32.bin"],
    ));
    v.push(manifest_case(
        "layers vs graph",
        |j| j["params"]["n_layers"] = 3.into(),
        vec!["graph tiny_", "new_k_2"],
    ));
    v.push(manifest_case(
        "graph name mismatch",
        |j| j["artifacts"]["contexts"]["decode"]["graph"] = "nope".into(),
        vec!["tiny_decode.bin", "nope"],
    ));
    v.push(manifest_case(
        "missing context binary",
        |j| j["artifacts"]["contexts"]["decode"]["bin"] = "gone.bin".into(),
        vec!["gone.bin"],
    ));
    v.push(manifest_case(
        "missing embed file",
        |j| j["artifacts"]["embed"]["file"] = "gone_embed.bin".into(),
        vec!["gone_embed.bin"],
    ));
    v.push(manifest_case(
        "missing tokenizer file",
        |j| j["artifacts"]["tokenizer"] = "gone_tok.json".into(),
        vec!["gone_tok.json"],
    ));
    v.push(manifest_case(
        "eos outside vocab",
        |j| j["params"]["eos_token_id"] = 5000.into(),
        vec!["eos_token_id", "5000"],
    ));

    // --- artifact content ---
    let (d, m) = fresh("truncbin");
    let b = d.join("tiny_decode.bin");
    let bytes = std::fs::read(&b).unwrap();
    std::fs::write(&b, &bytes[..bytes.len() / 2]).unwrap();
    v.push(Case {
        name: "truncated context binary",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny_decode.bin"],
    });
    let (d, m) = fresh("emptybin");
    std::fs::write(d.join("tiny_lmhead.bin"), b"").unwrap();
    v.push(Case {
        name: "empty context binary",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny_lmhead.bin", "empty"],
    });
    let (d, m) = fresh("garbagebin");
    std::fs::write(d.join("tiny_prefill.bin"), vec![0x5Au8; 1 << 16]).unwrap();
    v.push(Case {
        name: "garbage context binary",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny_prefill.bin", "30010"],
    });
    let (d, m) = fresh("badtok");
    std::fs::write(d.join("tokenizer.json"), "{\"version\": ").unwrap();
    v.push(Case {
        name: "corrupt tokenizer.json",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tokenizer.json"],
    });
    let (d, m) = fresh("longprompt");
    v.push(Case {
        name: "prompt longer than max_ctx",
        args: std_args(&m, &d, "4", &"x".repeat(200)),
        env: vec![],
        code: 1,
        needles: vec!["200 tokens", "max_ctx 64"],
    });

    // --- injected QNN failures ---
    for (tag, knob, needles) in [
        (
            "f1002",
            "contextCreateFromBinary=1002",
            vec!["1002", "QNN_COMMON_ERROR_MEM_ALLOC", "tiny_"],
        ),
        (
            "f5000",
            "contextCreateFromBinary=5000",
            vec!["5000", "creating context from"],
        ),
        (
            "f3ea",
            "contextCreateFromBinary=0x3ea",
            vec!["0x3ea", "hint"],
        ),
        (
            "fretr",
            "graphRetrieve=6002",
            vec!["6002", "retrieving graph"],
        ),
        (
            "fexec",
            "graphExecute=6031",
            vec!["6031", "executing graph"],
        ),
        (
            "fback",
            "backendCreate=4000",
            vec!["4000", "ADSP_LIBRARY_PATH"],
        ),
        (
            "finfo",
            "getBinaryInfo=30002",
            vec!["30002", "reading binary info"],
        ),
    ] {
        let (d, m) = fresh(tag);
        v.push(Case {
            name: "injected QNN failure",
            args: std_args(&m, &d, "4", "hi"),
            env: vec![("QNN_EMU_FAIL", knob.into())],
            code: 1,
            needles,
        });
    }
    let (d, m) = fresh("nan");
    v.push(Case {
        name: "NaN logits from the lm-head",
        args: std_args(&m, &d, "8", "hi"),
        env: vec![("QNN_EMU_NAN", "lmhead@5".into())],
        code: 1,
        needles: vec!["step 5", "tiny_lmhead", "non-finite"],
    });

    // --- tokenizer vs embedding table ---
    let (d, m) = fresh("bigtok");
    edit_json(&d.join("tokenizer.json"), |j| {
        let added = j["added_tokens"].as_array_mut().unwrap();
        for id in 258..262 {
            added.push(
                serde_json::json!({"id": id, "content": format!("<extra{id}>"),
                "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": true}),
            );
        }
    });
    v.push(Case {
        name: "tokenizer vocab larger than the embed table",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tokenizer.json", "262 tokens", "params.vocab"],
    });

    // --- --tokens-in ---
    for (tag, content, needles) in [
        (
            "tokrange",
            "1 2 258",
            vec!["tokens.txt", "258", "index 2", "vocab"],
        ),
        (
            "tokhuge",
            "[5, 99999999999]",
            vec!["tokens.txt", "99999999999"],
        ),
        ("tokword", "1, two, 3", vec!["tokens.txt", "\"two\""]),
        ("tokneg", "[1, -4]", vec!["tokens.txt", "-4"]),
        ("tokempty", "  \n", vec!["tokens.txt", "no token ids"]),
        ("tokjson", "[1, 2", vec!["tokens.txt", "JSON"]),
    ] {
        let (d, m) = fresh(tag);
        let f = d.join("tokens.txt");
        std::fs::write(&f, content).unwrap();
        let mut a = std_args(&m, &d, "4", "");
        a.pop();
        a.push("--tokens-in".into());
        a.push(f.into());
        v.push(Case {
            name: "bad --tokens-in file",
            args: a,
            env: vec![],
            code: 2,
            needles,
        });
    }
    let (d, m) = fresh("tokmissing");
    let mut a = std_args(&m, &d, "4", "");
    a.pop();
    a.push("--tokens-in".into());
    a.push(d.join("absent-ids.txt").into());
    v.push(Case {
        name: "missing --tokens-in file",
        args: a,
        env: vec![],
        code: 2,
        needles: vec!["absent-ids.txt"],
    });
    let (d, m) = fresh("tokandprompt");
    let f = d.join("ids.txt");
    std::fs::write(&f, "1 2").unwrap();
    let mut a = std_args(&m, &d, "4", "hi");
    a.push("--tokens-in".into());
    a.push(f.into());
    v.push(Case {
        name: "--tokens-in together with a prompt",
        args: a,
        env: vec![],
        code: 2,
        needles: vec!["--tokens-in"],
    });

    // --- non-UTF-8 prompt bytes (positional and -p) ---
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        let (d, m) = fresh("nonutf8");
        let mut a = std_args(&m, &d, "4", "");
        a.pop();
        a.push(OsString::from_vec(b"caf\xe9 \xff\xfe".to_vec()));
        v.push(Case {
            name: "non-UTF-8 prompt bytes",
            args: a,
            env: vec![],
            code: 2,
            needles: vec!["prompt", "UTF-8", "offset 3"],
        });
        let (d, m) = fresh("nonutf8flag");
        let mut a = std_args(&m, &d, "4", "");
        a.pop();
        a.push("-p".into());
        a.push(OsString::from_vec(vec![0x80, b'a']));
        v.push(Case {
            name: "non-UTF-8 -p prompt",
            args: a,
            env: vec![],
            code: 2,
            needles: vec!["prompt", "UTF-8"],
        });
    }

    // --- flags that would do nothing where they are given (round 3) ---
    for (name, extra, needles) in [
        (
            "--pp without --bench",
            vec!["--pp", "8"],
            vec!["--pp", "--bench"],
        ),
        (
            "--tg without --bench",
            vec!["--tg", "8"],
            vec!["--tg", "--bench"],
        ),
        (
            "sampling flags with --bench",
            vec!["--bench", "--temp", "0.7"],
            vec!["--bench", "sampling"],
        ),
        (
            "--bench -r 0",
            vec!["--bench", "-r", "0"],
            vec!["repetitions", "at least 1"],
        ),
        (
            "--transcript without -i",
            vec!["--transcript", "t.json"],
            vec!["--transcript", "-i"],
        ),
        (
            "--repeat-last-n below -1",
            vec!["--repeat-last-n", "-2"],
            vec!["--repeat-last-n", "-2"],
        ),
    ] {
        let (d, m) = fresh(name);
        let mut a = std_args(&m, &d, "4", "hi");
        if extra[0] == "--bench" {
            a.truncate(4);
        }
        a.extend(extra.iter().map(OsString::from));
        v.push(Case {
            name,
            args: a,
            env: vec![],
            code: 2,
            needles,
        });
    }
    let (d, m) = fresh("transcript-dir");
    let mut a = std_args(&m, &d, "4", "hi");
    a.extend(["-i", "--transcript"].map(OsString::from));
    a.push(d.join("no-such-dir").join("t.json").into());
    v.push(Case {
        name: "-i with an unwritable --transcript",
        args: a,
        env: vec![],
        code: 2,
        needles: vec!["--transcript", "no-such-dir", "cannot write"],
    });
    let (d, m) = fresh("n-overflow");
    v.push(Case {
        name: "n_tokens beyond 64 bits",
        args: std_args(&m, &d, "99999999999999999999999", "hi"),
        env: vec![],
        code: 2,
        needles: vec!["beyond any context length"],
    });
    let (_d, m) = fresh("root-forgotten");
    let mut a = std_args(&m, &m, "8", "The capital");
    a.remove(3);
    v.push(Case {
        name: "artifacts root left out (n_tokens in its place)",
        args: a,
        env: vec![],
        code: 2,
        needles: vec!["artifacts root \"8\"", "n_tokens", "<artifacts_root>"],
    });
    #[cfg(unix)]
    {
        let (d, m) = fresh("file-nonutf8");
        let f = d.join("prompt.txt");
        std::fs::write(&f, b"caf\xe9 \xff").unwrap();
        let mut a = std_args(&m, &d, "4", "");
        a.pop();
        a.push("-f".into());
        a.push(f.into());
        v.push(Case {
            name: "non-UTF-8 -f file",
            args: a,
            env: vec![],
            code: 2,
            needles: vec!["prompt.txt", "UTF-8", "offset 3"],
        });
    }
    let (d, _m) = fresh("dir-empty");
    let empty = d.join("empty-bundle");
    std::fs::create_dir_all(&empty).unwrap();
    v.push(Case {
        name: "a directory with no bundle as the manifest",
        args: std_args(&empty, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["empty-bundle", "no bundle"],
    });
    let (d, m) = fresh("dir-arch");
    let per_arch = d.join("per-arch");
    std::fs::create_dir_all(per_arch.join("v73")).unwrap();
    std::fs::copy(&m, per_arch.join("v73").join("tiny.json")).unwrap();
    v.push(Case {
        name: "a per-arch bundle without the device's arch",
        args: std_args(&per_arch, &per_arch, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["per-arch", "v81", "v73"],
    });

    // --- binaries that disagree with the manifest ---
    let (d, m) = fresh("bindims");
    let (other, _) = bundle(
        "bad-bindims-src",
        &SynthSpec {
            head_dim: 16,
            ..SynthSpec::default()
        },
    );
    std::fs::copy(other.join("tiny_decode.bin"), d.join("tiny_decode.bin")).unwrap();
    v.push(Case {
        name: "binary tensor dims disagree with the manifest",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny_decode", "head_dim=8"],
    });
    let (d, m) = fresh("bindtype");
    let (other, _) = bundle(
        "bad-bindtype-src",
        &SynthSpec {
            io: "bf16".into(),
            ..SynthSpec::default()
        },
    );
    std::fs::copy(other.join("tiny_decode.bin"), d.join("tiny_decode.bin")).unwrap();
    v.push(Case {
        name: "binary with an unsupported I/O dtype",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny_decode", "BFLOAT_16", "cannot read or write"],
    });

    // --- more files and paths ---
    // (A bundle directory in the manifest position is read as the bundle: see
    // tests/cli_regressions.rs; one without a bundle in it is a case above.)
    let (d, m) = fresh("shortembed");
    let e = d.join("tiny_embed_f32.bin");
    let bytes = std::fs::read(&e).unwrap();
    std::fs::write(&e, &bytes[..bytes.len() - 4]).unwrap();
    v.push(Case {
        name: "truncated embedding table",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![],
        code: 1,
        needles: vec!["tiny_embed_f32.bin"],
    });
    let (d, m) = fresh("badexpect");
    let mut a = std_args(&m, &d, "4", "hi");
    a.push("--expect-tokens".into());
    a.push("1,x,3".into());
    v.push(Case {
        name: "bad --expect-tokens list",
        args: a,
        env: vec![],
        code: 2,
        needles: vec!["--expect-tokens", "1,x,3"],
    });
    let (d, m) = fresh("fdevice");
    v.push(Case {
        name: "injected deviceCreate failure",
        args: std_args(&m, &d, "4", "hi"),
        env: vec![("QNN_EMU_FAIL", "deviceCreate=14002".into())],
        code: 1,
        needles: vec!["14002", "device"],
    });
    // --- Genie bundles (genie_config.json in the manifest position) ---
    for (name, edit, needles) in [
        (
            "Genie config with an unknown key",
            genie_edit(|c| c["dialog"]["engine"]["backend"]["QnnHtp"]["kv-dims"] = 8.into()),
            vec!["dialog.engine.backend.QnnHtp", "kv-dims"],
        ),
        (
            "Genie config naming a missing ctx-bin",
            genie_edit(|c| {
                c["dialog"]["engine"]["model"]["binary"]["ctx-bins"] =
                    serde_json::json!(["tiny_decode.bin", "missing_ar1.bin"])
            }),
            vec!["missing_ar1.bin", "not found"],
        ),
        (
            "Genie config over a context binary without attention_mask",
            genie_edit(|_| {}),
            vec!["no attention_mask input", "tiny_decode"],
        ),
        (
            "Genie config with another backend type",
            genie_edit(|c| c["dialog"]["engine"]["backend"]["type"] = "QnnGpu".into()),
            vec!["QnnGpu", "only \"QnnHtp\""],
        ),
        (
            "Genie config with a sampler top-p of 0",
            genie_edit(|c| {
                c["dialog"]["sampler"] = serde_json::json!({"version": 1, "top-p": 0.0})
            }),
            vec!["dialog.sampler.top-p", "out of range"],
        ),
        (
            "Genie config (no chat template) with --chat",
            genie_edit(|_| {}),
            vec!["Genie bundle has no chat template", "chat_template.jinja"],
        ),
    ] {
        let (d, _) = fresh(name);
        let cfg = d.join("genie_config.json");
        std::fs::write(&cfg, serde_json::to_vec_pretty(&edit).unwrap()).unwrap();
        let mut args = std_args(&cfg, &d, "4", "hi");
        if name.ends_with("--chat") {
            args.push("--chat".into());
        }
        v.push(Case {
            name,
            args,
            env: vec![],
            code: 1,
            needles,
        });
    }
    // Issue 17's `layers` section, on the exporter's tiny LFM2 and Gemma 3 bundles: the
    // edited manifest goes to a fresh directory, the artifacts stay where they are.
    for (name, dir, file, edit, needles) in [
        (
            "LFM2 state tensor missing from the graph",
            "lfm2-f32",
            "tiny_lfm2.json",
            Box::new(|v: &mut serde_json::Value| {
                v["layers"]["state"]["conv"]["past"] = "past_cnv_{i}".into()
            }) as Box<dyn FnOnce(&mut serde_json::Value)>,
            vec![
                "tiny_lfm2_decode",
                "has no input tensor named \"past_cnv_0\"",
            ],
        ),
        (
            "sliding window larger than the cache",
            "gemma3w-f32",
            "tiny_gemma3w.json",
            Box::new(|v: &mut serde_json::Value| v["layers"]["sliding_window"] = 600.into()),
            vec!["layers.sliding_window: 600 is larger than params.max_ctx 512"],
        ),
        (
            "layer type list longer than the graph's layers",
            "gemma3w-f32",
            "tiny_gemma3w.json",
            Box::new(|v: &mut serde_json::Value| {
                v["params"]["n_layers"] = 4.into();
                v["layers"]["types"]
                    .as_array_mut()
                    .unwrap()
                    .push("full_attention".into());
            }),
            vec![
                "has no tensor of layer 3",
                "the layer list is longer than the graph's layers",
            ],
        ),
        (
            "RoPE table of a layer type nobody uses",
            "gemma3w-f32",
            "tiny_gemma3w.json",
            Box::new(|v: &mut serde_json::Value| {
                v["layers"]["types"] =
                    serde_json::json!(["full_attention", "full_attention", "full_attention"]);
                remove(v, &["layers", "sliding_window"]);
            }),
            vec!["layers.rope.sliding_attention: no layer is of that type"],
        ),
    ] {
        let (d, m) = parity_bundle(dir, file);
        let out = tmp(&format!("bad-layers-{}", v.len()));
        let edited = out.join(file);
        std::fs::copy(&m, &edited).unwrap();
        edit_json(&edited, edit);
        v.push(Case {
            name,
            args: std_args(&edited, &d, "4", "hi"),
            env: vec![],
            code: 1,
            needles,
        });
    }
    v
}

#[test]
fn bad_input_catalogue() {
    let cases = cases();
    let n = cases.len();
    let mut failures = Vec::new();
    for c in cases {
        let mut cmd = command(bin());
        cmd.args(&c.args);
        for (k, val) in &c.env {
            cmd.env(k, val);
        }
        let o = cmd.output_within();
        let err = stderr(&o);
        let lines: Vec<&str> = err.lines().filter(|l| !l.starts_with("qhx ")).collect();
        let mut why = Vec::new();
        if o.status.code() != Some(c.code) {
            why.push(format!("exit {:?}, want {}", o.status.code(), c.code));
        }
        if err.contains("panicked") || err.contains("RUST_BACKTRACE") {
            why.push("panicked".into());
        }
        if lines.len() != 1 {
            why.push(format!("{} stderr lines", lines.len()));
        }
        for needle in &c.needles {
            if !err.contains(needle) {
                why.push(format!("no {needle:?}"));
            }
        }
        if c.name != "NaN logits from the lm-head" && !o.stdout.is_empty() {
            why.push(format!("stdout not empty: {:?}", stdout(&o)));
        }
        if !why.is_empty() {
            failures.push(format!("[{}] {}: {}", c.name, why.join(", "), err.trim()));
        }
    }
    println!("bad-input catalogue: {n} cases, {} failed", failures.len());
    assert!(n >= 40, "catalogue has only {n} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A Genie config over the tiny emulator bundle's decode binary (which has no Genie
/// tensors), after `f`.
fn genie_edit(f: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut c = serde_json::json!({"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": 64, "n-vocab": 258, "bos-token": 1, "eos-token": 2},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": 1,
            "backend": {"version": 1, "type": "QnnHtp", "QnnHtp": {"version": 1, "kv-dim": 16}},
            "model": {"version": 1, "type": "binary",
                "binary": {"version": 1, "ctx-bins": ["tiny_decode.bin"]}}}}});
    f(&mut c);
    c
}
