//! HTP performance votes (fact sheet §7.1): deviceGetInfrastructure → perf infrastructure →
//! createPowerConfigId / setPowerConfig with DCVS v3, RPC control latency and RPC polling,
//! passed as a NULL-terminated pointer array. Released (destroyPowerConfigId) when the
//! runtime drops. Written against the documented ABI; not verified on hardware.

use qnn_sys::perf::*;
use qnn_sys::{QnnHtpDcvsV3, QnnHtpPowerConfig, QnnHtpPowerConfigValue};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerfMode {
    Burst,
    High,
    Balanced,
    PowerSaver,
    /// No vote: the backend's defaults.
    Default,
}

impl PerfMode {
    pub fn parse(s: &str) -> Option<PerfMode> {
        Some(match s {
            "burst" => PerfMode::Burst,
            "high" | "high_performance" => PerfMode::High,
            "balanced" => PerfMode::Balanced,
            "power_saver" => PerfMode::PowerSaver,
            "default" => PerfMode::Default,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PerfMode::Burst => "burst",
            PerfMode::High => "high",
            PerfMode::Balanced => "balanced",
            PerfMode::PowerSaver => "power_saver",
            PerfMode::Default => "default",
        }
    }
}

fn dcvs(id: u32, dcvs_on: bool, mode: u32, sleep_us: u32, corner: u32) -> QnnHtpDcvsV3 {
    QnnHtpDcvsV3 {
        context_id: id,
        set_dcvs_enable: 1,
        dcvs_enable: dcvs_on as u32,
        power_mode: mode,
        set_sleep_latency: 1,
        sleep_latency: sleep_us,
        set_sleep_disable: 0,
        sleep_disable: 0,
        set_bus_params: 1,
        bus_voltage_corner_min: corner,
        bus_voltage_corner_target: corner,
        bus_voltage_corner_max: corner,
        set_core_params: 1,
        core_voltage_corner_min: corner,
        core_voltage_corner_target: corner,
        core_voltage_corner_max: corner,
    }
}

fn u32_cfg(option: u32, v: u32) -> QnnHtpPowerConfig {
    let mut raw = [0u32; 16];
    raw[0] = v;
    QnnHtpPowerConfig {
        option,
        value: QnnHtpPowerConfigValue { raw },
    }
}

/// The configs of a vote for `mode` on power-config `id` (empty for Default).
/// Burst: DCVS off, PERFORMANCE, sleep 40 µs, all corners MAX; RPC control latency 100 µs,
/// polling 9999 µs (onnxruntime / ExecuTorch values, fact sheet §7.1).
pub fn configs(mode: PerfMode, id: u32) -> Vec<QnnHtpPowerConfig> {
    let (d, latency, polling) = match mode {
        PerfMode::Default => return Vec::new(),
        PerfMode::Burst => (
            dcvs(id, false, POWER_MODE_PERFORMANCE, 40, CORNER_MAX),
            100,
            MAX_RPC_POLLING_TIME_US,
        ),
        PerfMode::High => (
            dcvs(id, false, POWER_MODE_PERFORMANCE, 100, CORNER_TURBO),
            100,
            MAX_RPC_POLLING_TIME_US,
        ),
        PerfMode::Balanced => (
            dcvs(id, true, POWER_MODE_PERFORMANCE, 1000, CORNER_NOM_PLUS),
            1000,
            0,
        ),
        PerfMode::PowerSaver => (
            dcvs(id, true, POWER_MODE_POWER_SAVER, 2000, CORNER_SVS),
            1000,
            0,
        ),
    };
    vec![
        QnnHtpPowerConfig {
            option: OPTION_DCVS_V3,
            value: QnnHtpPowerConfigValue { dcvs_v3: d },
        },
        u32_cfg(OPTION_RPC_CONTROL_LATENCY, latency),
        u32_cfg(OPTION_RPC_POLLING_TIME, polling),
    ]
}
