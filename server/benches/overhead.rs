//! What the server adds to a generation: the same request through a `Session` directly
//! (what `qhx_generate` runs) and through qhx_server's HTTP + SSE path, interleaved round by
//! round in one process, on a null-compute synthetic bundle (the emulator's graphs do no
//! arithmetic, so host work is all there is to measure). Reports, as medians over rounds,
//! the time to first token and the time per generated token of both, and their difference:
//! the server's overhead. Host figures of this machine, not phone figures.
//!
//!   cargo bench -p qhx-server --bench overhead -- [--json] [--rounds N] [--tokens N] [--shape S]
//! (scripts/server-overhead.sh builds the emulator first.)

use qhx::engine::GenConfig;
use qhx::load::{LoadOptions, Loaded};
use qhx::session::{Prompt, Session, TextRequest};
use qhx::text::TextSink;
use qhx_server::api::Defaults;
use qhx_server::listen::{self, Limits};
use qhx_server::metrics::Metrics;
use qhx_server::pool::Pool;
use qhx_server::routes::{self, App};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PROMPT: &str = "The quick brown fox jumps over the lazy dog";

struct Times {
    ttft_ms: f64,
    per_token_ms: f64,
}

/// Time of each token's callback.
struct Stamps(Vec<Instant>);

impl TextSink for Stamps {
    fn token(&mut self, _text: &str, _token: u32) -> qhx::Result<bool> {
        self.0.push(Instant::now());
        Ok(true)
    }
    fn end(&mut self, _rest: &str) -> qhx::Result<()> {
        Ok(())
    }
}

/// Round `i`'s prompt (the server is asked not to reuse a cached prefix either:
/// `cache_prompt: false`, so both paths prefill the whole prompt).
fn prompt(i: usize) -> String {
    format!("Round {i}: {PROMPT}")
}

fn direct(session: &mut Session, n: usize, i: usize) -> Times {
    let t0 = Instant::now();
    let ids = session
        .prompt_ids(&Prompt::Text(prompt(i)))
        .expect("encode");
    let cfg = GenConfig {
        ignore_eos: true,
        ..GenConfig::greedy(n)
    };
    let mut s = Stamps(Vec::new());
    session
        .generate(&ids, &cfg, n, &TextRequest::default(), 0.0, Some(&mut s))
        .expect("generate");
    let (first, last) = (s.0[0], s.0[s.0.len() - 1]);
    Times {
        ttft_ms: ms(first - t0),
        per_token_ms: ms(last - first) / (s.0.len() - 1) as f64,
    }
}

fn served(addr: std::net::SocketAddr, n: usize, i: usize) -> Times {
    let p = prompt(i);
    let body = format!(
        r#"{{"prompt":"{p}","max_tokens":{n},"temperature":0,"ignore_eos":true,"cache_prompt":false,"stream":true,"stream_options":{{"include_usage":true}}}}"#
    );
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(addr).expect("connect");
    sock.set_nodelay(true).expect("nodelay");
    write!(
        sock,
        "POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut r = BufReader::new(sock);
    let (mut first, mut last, mut tokens) = (None, None, 0usize);
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).expect("read") == 0 {
            break;
        }
        let Some(data) = line.trim().strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let now = Instant::now();
        let v: serde_json::Value = serde_json::from_str(data).expect("chunk JSON");
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
            continue;
        }
        first.get_or_insert(now);
        last = Some(now);
    }
    let (first, last) = (first.expect("no chunk"), last.expect("no chunk"));
    Times {
        ttft_ms: ms(first - t0),
        per_token_ms: ms(last - first) / tokens.saturating_sub(1).max(1) as f64,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let val = |k: &str, d: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_else(|| d.to_string())
    };
    let rounds: usize = val("--rounds", "9").parse().expect("--rounds");
    let n: usize = val("--tokens", "128").parse().expect("--tokens");
    let shape = val("--shape", "llama-1b");
    // The emulator prints a banner on fd 1, as the real backend does: stdout stays ours.
    qhx::os::stdio::isolate_stdout(false).expect("keep stdout");
    let mut out = qhx::os::stdio::stdout();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = root.join("target/release/libqnn_emu.so");
    assert!(
        lib.exists(),
        "{} is missing: cargo build --release -p qnn-emu",
        lib.display()
    );
    let spec = qnn_emu::writer::preset(&shape, "f16", 1024).expect("shape");
    let dir = root.join("target/bundles/server-overhead").join(&spec.name);
    let manifest = if dir.join(format!("{}.json", spec.name)).exists() {
        dir.join(format!("{}.json", spec.name))
    } else {
        std::fs::create_dir_all(&dir).expect("bundle dir");
        qnn_emu::writer::write_bundle(&dir, &spec).expect("write the synthetic bundle")
    };
    let bspec = Arc::new(qhx::bundle::Spec::load(&manifest, &dir).expect("manifest"));
    let loaded = Loaded::load(&bspec, &lib, &lib, &LoadOptions::default()).expect("load");
    let mut session = Session::new(Arc::clone(&bspec), loaded.clone()).expect("session");
    let server_session = Session::new(Arc::clone(&bspec), loaded.clone()).expect("session");
    let metrics = Arc::new(Metrics::new(1, 4));
    let pool = Arc::new(Pool::new(vec![server_session], 4, Arc::clone(&metrics)));
    let app = Arc::new(App::new(
        Arc::clone(&pool),
        metrics,
        Defaults {
            sampler: Default::default(),
            completion_max_tokens: 16,
            spec: None,
        },
        "bench".into(),
        None,
        1 << 20,
        Duration::from_secs(30),
        None,
        loaded.clone(),
        Arc::clone(&bspec),
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let limits = Limits {
        max_connections: 16,
        header_timeout: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(5),
    };
    let router = routes::router(app);
    let server = rt.spawn(listen::serve(
        listener,
        router,
        limits,
        async {
            let _ = stop_rx.await;
        },
        pool,
    ));
    // Warm-up of both paths, then interleaved rounds.
    direct(&mut session, n, 0);
    served(addr, n, 0);
    let (mut d_ttft, mut d_tok, mut s_ttft, mut s_tok) = (vec![], vec![], vec![], vec![]);
    for i in 1..=rounds {
        let d = direct(&mut session, n, i);
        let s = served(addr, n, i);
        d_ttft.push(d.ttft_ms);
        d_tok.push(d.per_token_ms);
        s_ttft.push(s.ttft_ms);
        s_tok.push(s.per_token_ms);
    }
    let _ = stop_tx.send(());
    let _ = rt.block_on(server);
    let (dt, dk, st, sk) = (median(d_ttft), median(d_tok), median(s_ttft), median(s_tok));
    let row = serde_json::json!({
        "shape": shape, "tokens": n, "rounds": rounds,
        "direct_ttft_ms": dt, "server_ttft_ms": st, "ttft_overhead_ms": st - dt,
        "direct_ms_per_token": dk, "server_ms_per_token": sk, "per_token_overhead_ms": sk - dk,
        "targets": {"per_token_overhead_ms": 0.1, "ttft_overhead_ms": 2.0},
        "note": "null-compute emulator bundle, this host: not a phone figure",
    });
    if json {
        let _ = writeln!(out, "{row}");
    } else {
        let _ = writeln!(out, "| path | TTFT ms | ms/token |\n|---|---|---|");
        let _ = writeln!(out, "| Session (qhx_generate's path) | {dt:.3} | {dk:.4} |");
        let _ = writeln!(out, "| qhx_server, HTTP + SSE | {st:.3} | {sk:.4} |");
        let _ = writeln!(
            out,
            "| overhead (target ≤ 2 ms, ≤ 0.1 ms) | {:.3} | {:.4} |",
            st - dt,
            sk - dk
        );
        eprintln!("{shape}, {n} tokens, median of {rounds} interleaved rounds");
    }
}
