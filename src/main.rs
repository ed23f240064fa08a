//! The `roll-tui` binary: parses the command line and hands over to `roll::cli`.

use clap::Parser;

fn main() {
    let cli = roll::cli::Cli::parse();
    match roll::cli::main_with(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
