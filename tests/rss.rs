//! No leak across repeated use: 200 generations (a fresh engine each) and a 200-turn
//! session (one engine, reset between turns) in one process, through the library API and
//! the emulator. Resident memory must stay within 5 % of its post-warm-up value.
#![cfg(target_os = "linux")]

mod common;

use qhx::bundle::manifest::Manifest;
use qhx::engine::{Engine, GenConfig, Next};
use qhx::load::LoadOptions;
use qnn_emu::writer::SynthSpec;

/// Resident bytes of the mappings `/proc/self/maps` lists, counted page by page with
/// mincore(2). Natively this follows VmRSS (plus page-cache pages of mapped files this
/// process has not touched yet). Under qemu-user it is the guest program's own memory: qemu
/// answers `/proc/self/maps` with the guest's mappings, while `statm` and `status` describe
/// the whole qemu process, which keeps ~0.55 MiB of bookkeeping for every guest thread ever
/// created (qemu 7.2; see README, "aarch64").
fn resident_bytes() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let mut pages = Vec::new();
    let mut total = 0;
    for line in maps.lines() {
        let range = line.split_whitespace().next().expect("maps line");
        let (a, b) = range.split_once('-').expect("maps range");
        let a = usize::from_str_radix(a, 16).expect("maps start");
        let b = usize::from_str_radix(b, 16).expect("maps end");
        pages.resize((b - a).div_ceil(page), 0u8);
        // SAFETY: mincore only inspects the page tables of [a, b) (page-aligned, as maps
        // prints it) and writes one byte per page into `pages`, sized for it. It fails with
        // ENOMEM for ranges gone since the read or not accessible ([vsyscall]; PROT_NONE
        // under qemu), which have nothing resident to count.
        let rc = unsafe { libc::mincore(a as *mut libc::c_void, b - a, pages.as_mut_ptr()) };
        if rc == 0 {
            total += pages.iter().filter(|&&p| p & 1 != 0).count() * page;
        }
    }
    total as u64
}

/// VmRSS as the kernel reports it for this process (the whole qemu process under qemu-user):
/// printed beside the measure above, not asserted.
fn vm_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS");
    kib * 1024
}

fn check_flat(what: &str, samples: &[u64], vm_rss: &[u64]) {
    let base = samples[0];
    let max = *samples.iter().max().unwrap();
    let last = *samples.last().unwrap();
    println!(
        "rss {what}: after warm-up {} KiB, max {} KiB, last {} KiB ({:+.2} %); \
         VmRSS {} -> {} KiB",
        base / 1024,
        max / 1024,
        last / 1024,
        (last as f64 / base as f64 - 1.0) * 100.0,
        vm_rss[0] / 1024,
        vm_rss.last().unwrap() / 1024,
    );
    assert!(
        (max as f64) <= base as f64 * 1.05,
        "{what}: RSS grew from {base} to {max} bytes: {samples:?}"
    );
}

#[test]
fn rss_is_flat_over_200_generations_and_200_turns() {
    let (dir, m) = common::bundle("rss", &SynthSpec::default());
    let lib = common::emu();
    let manifest = Manifest::load(&m, &dir).unwrap();
    let model = std::sync::Arc::new(
        qhx::load::manifest::load(manifest, &lib, &lib, &LoadOptions::default()).unwrap(),
    );
    let cfg = GenConfig::greedy(8);
    let prompts = ["hello there", "a", "the quick brown fox", "rss"];
    let run = |engine: &mut Engine, i: usize| {
        let ids = model
            .tokenizer
            .encode(prompts[i % prompts.len()], model.bos)
            .unwrap();
        let mut stream = model.tokenizer.stream();
        let mut text = String::new();
        let out = engine
            .generate(&ids, &cfg, 0.0, |t| {
                if let Some(p) = stream.step(t)? {
                    text.push_str(&p);
                }
                Ok(Next::Continue)
            })
            .unwrap();
        assert!(!out.output_ids.is_empty());
        out.output_ids
    };

    // 200 generations, a fresh engine (bindings, RoPE table, buffers) each time.
    let warmup = 20;
    let (mut samples, mut vm_rss) = (Vec::new(), Vec::new());
    let mut first = None;
    for i in 0..200 {
        let mut e = Engine::new(&model).unwrap();
        let ids = run(&mut e, i);
        // Deterministic: the same prompt gives the same tokens every time.
        if i % prompts.len() == 0 {
            match &first {
                None => first = Some(ids),
                Some(f) => assert_eq!(f, &ids, "generation {i} differs"),
            }
        }
        if i + 1 >= warmup {
            samples.push(resident_bytes());
            vm_rss.push(vm_rss_bytes());
        }
    }
    check_flat("200 generations", &samples, &vm_rss);

    // A 200-turn session on one engine, reset between turns.
    let mut e = Engine::new(&model).unwrap();
    let (mut samples, mut vm_rss) = (Vec::new(), Vec::new());
    for i in 0..200 {
        e.reset();
        run(&mut e, i);
        if i + 1 >= warmup {
            samples.push(resident_bytes());
            vm_rss.push(vm_rss_bytes());
        }
    }
    check_flat("200 turns", &samples, &vm_rss);
}
