//! `qnn-emu-bundle <shape> <io> <ctx> <out_dir>`: write a null-compute synthetic bundle of a
//! reference shape (`deepseek-1.5b` | `llama-1b`, io `f16` | `ufixed16`) and print the
//! manifest path. Bundles of one shape share the embedding table and tokenizer in `out_dir`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [shape, io, ctx, out] = a.as_slice() else {
        eprintln!(
            "usage: qnn-emu-bundle <deepseek-1.5b|llama-1b|tiny> <f16|ufixed16> <ctx> <out_dir>"
        );
        return ExitCode::from(2);
    };
    let Ok(ctx) = ctx.parse::<usize>() else {
        eprintln!("qnn-emu-bundle: ctx {ctx:?} is not a number");
        return ExitCode::from(2);
    };
    let Some(spec) = qnn_emu::writer::preset(shape, io, ctx) else {
        eprintln!("qnn-emu-bundle: unknown shape {shape:?} (deepseek-1.5b, llama-1b, tiny)");
        return ExitCode::from(2);
    };
    match qnn_emu::writer::write_bundle(&PathBuf::from(out), &spec) {
        Ok(m) => {
            println!("{}", m.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("qnn-emu-bundle: writing {out}: {e}");
            ExitCode::FAILURE
        }
    }
}
