//! The `tollgate` binary: a thin shell over the library (see `tollgate::cli`).

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
