//! Environment warnings (stderr, never failures) and the QNN log forwarded at -v / -vv with
//! its levels.

mod common;

use common::*;
use qnn_emu::writer::SynthSpec;

#[test]
fn device_arch_and_soc_mismatch_warn_but_run() {
    let (d, m) = bundle("diag-arch", &SynthSpec::default());
    let o = generate(
        &m,
        &d,
        "3",
        "hi",
        &[],
        &[("QNN_EMU_ARCH", "79"), ("QNN_EMU_SOC_MODEL", "69")],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!o.stdout.is_empty());
    assert!(
        err.contains(
            "qhx: warning: the bundle was built for dsp_arch v81 but the device reports v79"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "qhx: warning: the bundle was built for soc_model 87 but the device reports 69"
        ),
        "{err}"
    );
    // Matching targets: no warning at all. The emulator is not a real libQnnHtp, so no
    // ADSP_LIBRARY_PATH warning either, even with it unset.
    let o = generate(&m, &d, "3", "hi", &[], &[("ADSP_LIBRARY_PATH", "")]);
    assert!(o.status.success());
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

#[test]
fn vendor_ld_library_path_warns() {
    let (d, m) = bundle("diag-ld", &SynthSpec::default());
    let o = generate(
        &m,
        &d,
        "2",
        "hi",
        &[],
        &[("LD_LIBRARY_PATH", "/tmp:/vendor/lib64")],
    );
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("qhx: warning: LD_LIBRARY_PATH lists /vendor/lib64"),
        "{err}"
    );
}

#[test]
fn qnn_log_is_forwarded_with_levels() {
    let (d, m) = bundle("diag-log", &SynthSpec::default());
    let quiet = stderr(&generate(&m, &d, "2", "hi", &[], &[]));
    assert!(!quiet.contains("qnn["), "{quiet}");
    let v = stderr(&generate(&m, &d, "2", "hi", &["-v"], &[]));
    assert!(v.contains("qnn[INFO] qnn-emu: context created"), "{v}");
    assert!(!v.contains("qnn[VERBOSE]"), "{v}");
    let vv = stderr(&generate(&m, &d, "2", "hi", &["-vv"], &[]));
    assert!(vv.contains("qnn[INFO] qnn-emu: context created"), "{vv}");
    assert!(
        vv.contains("qnn[VERBOSE] qnn-emu: graph tiny_decode retrieved"),
        "{vv}"
    );
    // Error lines are quoted in the failure message even without -v, and printed at -v.
    let o = generate(
        &m,
        &d,
        "2",
        "hi",
        &[],
        &[("QNN_EMU_FAIL", "graphExecute@1=6031")],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        !e.contains("qnn[ERROR]")
            && e.contains("backend said: qnn-emu: injected graphExecute failure"),
        "{e}"
    );
    let o = generate(
        &m,
        &d,
        "2",
        "hi",
        &["-v"],
        &[("QNN_EMU_FAIL", "graphExecute@1=6031")],
    );
    assert!(
        stderr(&o).contains("qnn[ERROR] qnn-emu: injected graphExecute failure"),
        "{}",
        stderr(&o)
    );
}
