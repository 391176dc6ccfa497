//! The C types of `include/qhexrt/qhexrt_c.h`, field for field. The layout tests below pin
//! sizes and offsets for LP64 targets; `tests/capi/capi_test.c` asserts the same numbers
//! against the header, so the two cannot drift apart. Plain data: `unsafe` is forbidden here.

#![forbid(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};

pub type Status = i32;

pub const OK: Status = 0;
pub const INVALID_ARGUMENT: Status = 1;
pub const IO: Status = 2;
pub const QNN_LOAD: Status = 3;
pub const QNN_API: Status = 4;
pub const MODEL: Status = 5;
pub const UNSUPPORTED: Status = 6;
pub const CANCELLED: Status = 7;
pub const OUT_OF_MEMORY: Status = 8;
pub const INTERNAL: Status = 9;
pub const BUSY: Status = 10;
pub const CONTEXT_FULL: Status = 11;
pub const HOST_OP_FAILED: Status = 12;
pub const GRAMMAR: Status = 13;

/// CamelCase names, as QHexRT prints them (`HostOpFailed`).
pub fn status_name(s: Status) -> &'static std::ffi::CStr {
    match s {
        OK => c"Ok",
        INVALID_ARGUMENT => c"InvalidArgument",
        IO => c"Io",
        QNN_LOAD => c"QnnLoad",
        QNN_API => c"QnnApi",
        MODEL => c"Model",
        UNSUPPORTED => c"Unsupported",
        CANCELLED => c"Cancelled",
        OUT_OF_MEMORY => c"OutOfMemory",
        INTERNAL => c"Internal",
        BUSY => c"Busy",
        CONTEXT_FULL => c"ContextFull",
        HOST_OP_FAILED => c"HostOpFailed",
        GRAMMAR => c"Grammar",
        _ => c"Unknown",
    }
}

pub const GRAMMAR_NONE: i32 = 0;
pub const GRAMMAR_JSON: i32 = 1;
pub const GRAMMAR_TOOL_CALL: i32 = 2;
pub const GRAMMAR_TOOL_CALL_OPTIONAL: i32 = 3;
pub const GRAMMAR_LARK: i32 = 4;

#[repr(C)]
pub struct Inputs {
    pub text: *const c_char,
    pub system_prompt: *const c_char,
    pub history: *const *const c_char,
    pub n_history: i32,
    pub no_template: i32,
    pub image_path: *const c_char,
    pub mask_path: *const c_char,
    pub audio: *const f32,
    pub n_audio: i32,
    pub audio_sr: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct GenCfg {
    pub max_new_tokens: i32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: i32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub seed: i64,
    pub stop_strings: *const *const c_char,
    pub n_stop_strings: i32,
    pub grammar_kind: i32,
    pub grammar: *const c_char,
}

impl Default for GenCfg {
    /// Greedy, 64 tokens, every filter off: what QHexRT-compatible runners default to.
    fn default() -> Self {
        GenCfg {
            max_new_tokens: 64,
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
            stop_strings: std::ptr::null(),
            n_stop_strings: 0,
            grammar_kind: GRAMMAR_NONE,
            grammar: std::ptr::null(),
        }
    }
}

pub type ShouldCancel = Option<unsafe extern "C" fn(user: *mut c_void) -> c_int>;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct GenerateOptions {
    pub struct_size: u32,
    pub disable_thinking: i32,
    pub should_cancel: ShouldCancel,
    pub should_cancel_user: *mut c_void,
    /// qhx extension: `--spec`'s words (NULL or "": none).
    pub speculation: *const c_char,
    /// qhx extension: `--draft-max` (<= 0: the default).
    pub draft_max: i32,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            struct_size: std::mem::size_of::<GenerateOptions>() as u32,
            disable_thinking: 0,
            should_cancel: None,
            should_cancel_user: std::ptr::null_mut(),
            speculation: std::ptr::null(),
            draft_max: 0,
        }
    }
}

pub type TokenCb = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        utf8: *const c_char,
        len: c_int,
        token_id: c_int,
        is_final: c_int,
    ) -> c_int,
>;

#[repr(C)]
pub struct Output {
    pub text: *const c_char,
    pub n_prompt: i32,
    pub n_generated: i32,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    pub embedding: *const f32,
    pub n_embedding: i32,
    pub audio: *const f32,
    pub n_audio: i32,
    pub sample_rate: i32,
    pub image: *const u8,
    pub img_w: i32,
    pub img_h: i32,
    pub img_c: i32,
}

impl Output {
    pub fn empty() -> Output {
        Output {
            text: std::ptr::null(),
            n_prompt: 0,
            n_generated: 0,
            prefill_ms: 0.0,
            decode_ms: 0.0,
            embedding: std::ptr::null(),
            n_embedding: 0,
            audio: std::ptr::null(),
            n_audio: 0,
            sample_rate: 0,
            image: std::ptr::null(),
            img_w: 0,
            img_h: 0,
            img_c: 0,
        }
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn inputs() {
        assert_eq!(size_of::<Inputs>(), 64);
        assert_eq!(offset_of!(Inputs, history), 16);
        assert_eq!(offset_of!(Inputs, n_history), 24);
        assert_eq!(offset_of!(Inputs, no_template), 28);
        assert_eq!(offset_of!(Inputs, image_path), 32);
        assert_eq!(offset_of!(Inputs, audio), 48);
        assert_eq!(offset_of!(Inputs, audio_sr), 60);
    }

    #[test]
    fn gen_cfg() {
        assert_eq!(size_of::<GenCfg>(), 56);
        assert_eq!(offset_of!(GenCfg, repetition_penalty), 20);
        assert_eq!(offset_of!(GenCfg, seed), 24);
        assert_eq!(offset_of!(GenCfg, stop_strings), 32);
        assert_eq!(offset_of!(GenCfg, n_stop_strings), 40);
        assert_eq!(offset_of!(GenCfg, grammar_kind), 44);
        assert_eq!(offset_of!(GenCfg, grammar), 48);
    }

    #[test]
    fn options() {
        assert_eq!(offset_of!(GenerateOptions, disable_thinking), 4);
        assert_eq!(offset_of!(GenerateOptions, should_cancel), 8);
        assert_eq!(offset_of!(GenerateOptions, should_cancel_user), 16);
        assert_eq!(offset_of!(GenerateOptions, speculation), 24);
        assert_eq!(offset_of!(GenerateOptions, draft_max), 32);
        assert_eq!(size_of::<GenerateOptions>(), 40);
    }

    #[test]
    fn output() {
        assert_eq!(size_of::<Output>(), 88);
        assert_eq!(offset_of!(Output, prefill_ms), 16);
        assert_eq!(offset_of!(Output, decode_ms), 24);
        assert_eq!(offset_of!(Output, embedding), 32);
        assert_eq!(offset_of!(Output, n_embedding), 40);
        assert_eq!(offset_of!(Output, audio), 48);
        assert_eq!(offset_of!(Output, sample_rate), 60);
        assert_eq!(offset_of!(Output, image), 64);
        assert_eq!(offset_of!(Output, img_c), 80);
    }
}
