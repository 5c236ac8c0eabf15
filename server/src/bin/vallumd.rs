//! `vallumd`: parses the configuration and runs the server (see `vallum_server::run`).

use clap::Parser;

/// mimalloc instead of glibc's malloc, keeping freed memory 10 s (see
/// `vallum_server::allocator`).
#[global_allocator]
static ALLOCATOR: vallum_server::allocator::MiMalloc = vallum_server::allocator::MiMalloc;

fn main() -> std::process::ExitCode {
    vallum_server::allocator::keep_freed_memory();
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
