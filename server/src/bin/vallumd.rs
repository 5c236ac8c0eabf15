//! `vallumd`: parses the configuration and runs the server (see `vallum_server::run`).

use clap::Parser;

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
