//! Parses a restore file given on the command line and prints its canonical form or errors
//! (`cargo run -p vallum-engine --example restore_check -- FILE [-6]`).
fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: restore_check FILE [-6]");
        std::process::exit(2);
    };
    let family = if args.next().as_deref() == Some("-6") {
        vallum_engine::model::Family::Ipv6
    } else {
        vallum_engine::model::Family::Ipv4
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(2);
        }
    };
    let opts = vallum_engine::restore::ParseOptions {
        family,
        ..Default::default()
    };
    match vallum_engine::restore::parse(&text, &opts) {
        Ok(r) => print!(
            "{}",
            vallum_engine::restore::print(&r.tables, &Default::default())
        ),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
