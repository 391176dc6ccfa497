//! Environment checks run after loading: warnings for the usual causes of opaque NPU
//! failures (a missing skel or `ADSP_LIBRARY_PATH`, vendor QNN libraries shadowing the
//! bundled ones, a bundle built for another SoC). They never fail a run.

use std::path::{Path, PathBuf};

/// What the checks look at, gathered once ([`EnvFacts::gather`]) or built by tests.
#[derive(Debug, Clone, Default)]
pub struct EnvFacts {
    /// The backend library path as given.
    pub backend_path: PathBuf,
    /// The backend's build id and provider name (the emulator says "qnn-emu").
    pub backend_build_id: String,
    pub backend_provider: String,
    pub adsp_library_path: Option<String>,
    pub ld_library_path: Option<String>,
    /// Files of QNN libraries mapped into this process (from /proc/self/maps).
    pub mapped_qnn_libs: Vec<PathBuf>,
    /// The host cannot reach a Hexagon NPU (it is not an ARM SoC), so a real libQnnHtp here
    /// is Qualcomm's simulator, which reports a placeholder platform (v68, soc 30).
    pub host_without_npu: bool,
}

/// What the bundle says it was built for and what the device reports.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub bundle_dsp_arch: Option<String>,
    pub bundle_soc_model: Option<u32>,
    pub device_dsp_arch: Option<u32>,
    pub device_soc_model: Option<u32>,
}

impl EnvFacts {
    pub fn gather(
        backend_path: &Path,
        build_id: &str,
        provider: &str,
        system_path: &Path,
    ) -> EnvFacts {
        let var = |k: &str| std::env::var(k).ok();
        EnvFacts {
            backend_path: backend_path.to_path_buf(),
            backend_build_id: build_id.to_string(),
            backend_provider: provider.to_string(),
            adsp_library_path: var("ADSP_LIBRARY_PATH"),
            ld_library_path: var("LD_LIBRARY_PATH"),
            mapped_qnn_libs: mapped_libs(&[backend_path, system_path]),
            host_without_npu: !cfg!(any(target_arch = "aarch64", target_arch = "arm")),
        }
    }

    /// A real libQnnHtp (not the emulator or another backend): decided by file name and by
    /// what the library reports about itself.
    pub fn is_real_htp(&self) -> bool {
        let file = self
            .backend_path
            .file_name()
            .map(|f| f.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let says_emu = [&self.backend_build_id, &self.backend_provider]
            .iter()
            .any(|s| s.to_lowercase().contains("emu"));
        file.contains("qnnhtp") && !says_emu
    }

    /// Qualcomm's HTP simulator: a real libQnnHtp on a host without an NPU. It runs any
    /// dsp_arch's binaries, so the platform it reports is no reason to warn.
    pub fn is_simulator(&self) -> bool {
        self.is_real_htp() && self.host_without_npu
    }
}

/// Paths of mapped shared objects named like QNN libraries or like `extra` files.
fn mapped_libs(extra: &[&Path]) -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let names: Vec<String> = extra
        .iter()
        .filter_map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
        .collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let p = Path::new(path);
        let f = p
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if (f.starts_with("libQnn") || names.contains(&f)) && !out.iter().any(|o| o == p) {
            out.push(p.to_path_buf());
        }
    }
    out
}

/// "v81" / "V81" / "81" -> 81.
pub fn parse_arch(s: &str) -> Option<u32> {
    s.trim()
        .trim_start_matches(['v', 'V'])
        .parse()
        .ok()
        .filter(|&a| a > 0)
}

fn under_vendor(p: &Path) -> bool {
    p.starts_with("/vendor") || p.starts_with("/system/vendor")
}

/// The warnings for these facts, one line each, without a prefix.
pub fn warnings(f: &EnvFacts, t: &Targets) -> Vec<String> {
    let mut w = Vec::new();
    let arch = t.bundle_dsp_arch.as_deref().and_then(parse_arch);
    if f.is_real_htp() && !f.is_simulator() {
        let skel = arch.map(|a| format!("libQnnHtpV{a}Skel.so"));
        let skel_desc = skel
            .clone()
            .unwrap_or_else(|| "libQnnHtpV<arch>Skel.so".to_string());
        match f.adsp_library_path.as_deref().filter(|s| !s.is_empty()) {
            None => w.push(format!(
                "ADSP_LIBRARY_PATH is not set: the DSP loader may not find {skel_desc} (set it to the directory holding the skel, e.g. '/data/local/tmp/wq;/vendor/dsp/cdsp')"
            )),
            Some(dirs) => {
                let dirs: Vec<&str> = dirs.split([';', ':']).filter(|d| !d.is_empty()).collect();
                let found = dirs.iter().any(|d| {
                    let d = Path::new(d);
                    match &skel {
                        Some(s) => d.join(s).is_file(),
                        None => std::fs::read_dir(d).is_ok_and(|rd| {
                            rd.flatten().any(|e| {
                                let n = e.file_name().to_string_lossy().into_owned();
                                n.starts_with("libQnnHtpV") && n.ends_with("Skel.so")
                            })
                        }),
                    }
                });
                if !found {
                    w.push(format!(
                        "ADSP_LIBRARY_PATH ({}) has no {skel_desc} for the bundle's dsp_arch",
                        dirs.join(";")
                    ));
                }
            }
        }
    }
    if let Some(ld) = f.ld_library_path.as_deref() {
        let vendor: Vec<&str> = ld
            .split(':')
            .filter(|d| under_vendor(Path::new(d)))
            .collect();
        if !vendor.is_empty() {
            w.push(format!(
                "LD_LIBRARY_PATH lists {}: vendor QNN libraries there can shadow the ones you ship; put your directory first or drop it",
                vendor.join(":")
            ));
        }
    }
    for p in &f.mapped_qnn_libs {
        if under_vendor(p) {
            w.push(format!(
                "{} was loaded from the vendor partition: its QNN version may not match the bundle; pass the full path of the library you ship",
                p.display()
            ));
        }
    }
    if f.is_simulator() {
        return w;
    }
    if let (Some(b), Some(d)) = (arch, t.device_dsp_arch) {
        if d != 0 && b != d {
            w.push(format!(
                "the bundle was built for dsp_arch v{b} but the device reports v{d}: context creation may fail or run slowly"
            ));
        }
    }
    if let (Some(b), Some(d)) = (t.bundle_soc_model, t.device_soc_model) {
        if d != 0 && b != d {
            w.push(format!(
                "the bundle was built for soc_model {b} but the device reports {d}"
            ));
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn htp(dir: &Path) -> EnvFacts {
        EnvFacts {
            backend_path: dir.join("libQnnHtp.so"),
            backend_build_id: "v2.43.0".into(),
            backend_provider: "HTP_QTI_AISW".into(),
            ..Default::default()
        }
    }

    fn v81() -> Targets {
        Targets {
            bundle_dsp_arch: Some("v81".into()),
            bundle_soc_model: Some(87),
            device_dsp_arch: Some(81),
            device_soc_model: Some(87),
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(parse_arch("v81"), Some(81));
        assert_eq!(parse_arch("V73"), Some(73));
        assert_eq!(parse_arch("69"), Some(69));
        assert_eq!(parse_arch("vx"), None);
    }

    #[test]
    fn emulator_is_not_a_real_htp() {
        let mut f = htp(Path::new("/x"));
        assert!(f.is_real_htp());
        f.backend_build_id = "qnn-emu v0.1.0".into();
        assert!(!f.is_real_htp());
        let f = EnvFacts {
            backend_path: "/x/libqnn_emu.so".into(),
            ..Default::default()
        };
        assert!(!f.is_real_htp());
        assert!(warnings(&f, &v81()).is_empty());
    }

    #[test]
    fn adsp_library_path_unset_or_without_the_skel() {
        let d = std::env::temp_dir().join(format!("qhx-envcheck-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mut f = htp(&d);
        let w = warnings(&f, &v81());
        assert!(
            w.len() == 1 && w[0].contains("ADSP_LIBRARY_PATH is not set"),
            "{w:?}"
        );
        assert!(w[0].contains("libQnnHtpV81Skel.so"), "{w:?}");
        f.adsp_library_path = Some(format!("{};/vendor/dsp/cdsp", d.display()));
        let w = warnings(&f, &v81());
        assert!(
            w.len() == 1 && w[0].contains("has no libQnnHtpV81Skel.so"),
            "{w:?}"
        );
        std::fs::write(d.join("libQnnHtpV81Skel.so"), b"").unwrap();
        assert!(warnings(&f, &v81()).is_empty());
        // A skel for another arch does not count.
        let t = Targets {
            bundle_dsp_arch: Some("v79".into()),
            device_dsp_arch: Some(79),
            ..v81()
        };
        assert!(warnings(&f, &t)[0].contains("libQnnHtpV79Skel.so"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn vendor_libraries_and_target_mismatch() {
        let f = EnvFacts {
            backend_path: "/x/libqnn_emu.so".into(),
            ld_library_path: Some("/data/local/tmp/wq:/vendor/lib64".into()),
            mapped_qnn_libs: vec!["/vendor/lib64/libQnnSystem.so".into()],
            ..Default::default()
        };
        let t = Targets {
            device_dsp_arch: Some(79),
            device_soc_model: Some(69),
            ..v81()
        };
        let w = warnings(&f, &t);
        assert_eq!(w.len(), 4, "{w:?}");
        assert!(w[0].contains("LD_LIBRARY_PATH lists /vendor/lib64"));
        assert!(w[1].contains("/vendor/lib64/libQnnSystem.so"));
        assert!(w[2].contains("v81") && w[2].contains("v79"));
        assert!(w[3].contains("soc_model 87") && w[3].contains("69"));
    }

    #[test]
    fn the_simulator_platform_is_no_mismatch() {
        // The x86 HTP simulator reports v68 / soc 30 and runs v79 binaries.
        let t = Targets {
            bundle_dsp_arch: Some("v79".into()),
            bundle_soc_model: Some(69),
            device_dsp_arch: Some(68),
            device_soc_model: Some(30),
        };
        let mut f = htp(Path::new("/x"));
        f.host_without_npu = true;
        assert!(f.is_simulator());
        assert!(warnings(&f, &t).is_empty(), "{:?}", warnings(&f, &t));
        // The same report from a phone is a real conflict (and the skel check applies).
        f.host_without_npu = false;
        let w = warnings(&f, &t);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[1].contains("v79") && w[1].contains("v68"), "{w:?}");
        assert!(
            w[2].contains("soc_model 69") && w[2].contains("30"),
            "{w:?}"
        );
        // The emulator models a device, whatever the host.
        let emu = EnvFacts {
            backend_path: "/x/libqnn_emu.so".into(),
            host_without_npu: true,
            ..Default::default()
        };
        assert_eq!(warnings(&emu, &t).len(), 2);
    }
}
