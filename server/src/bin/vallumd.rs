//! `vallumd`: parses the configuration and runs the server (see `vallum_server::run`).

use clap::Parser;

/// mimalloc instead of glibc's malloc: a 10k-rule Apply allocates and frees a few MB of rules
/// (parse, validate, compile, the retired snapshot), and glibc handed that memory back to the
/// kernel after every call and page-faulted it in again on the next (~1 ms per Apply of
/// acl1_10k; BENCHMARKS.md §6).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let config = vallum_server::Config::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vallumd: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(vallum_server::run(config)) {
        Ok(summary) => {
            print!("{summary}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vallumd: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
