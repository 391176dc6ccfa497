//! `write_bundle <dir> [--null-compute]`: write the tiny synthetic bundle (the tests'
//! default shape) into `<dir>` and print the manifest path. Used by scripts/valgrind.sh.

use qnn_emu::writer::{write_bundle, SynthSpec};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: write_bundle <dir> [--null-compute]");
        std::process::exit(2);
    };
    let spec = SynthSpec {
        null_compute: args.any(|a| a == "--null-compute"),
        ..Default::default()
    };
    std::fs::create_dir_all(&dir).expect("create dir");
    match write_bundle(std::path::Path::new(&dir), &spec) {
        Ok(m) => println!("{}", m.display()),
        Err(e) => {
            eprintln!("write_bundle: {dir}: {e}");
            std::process::exit(1);
        }
    }
}
