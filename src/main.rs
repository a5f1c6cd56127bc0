//! The `tollgate` binary: a thin shell over the library (see `tollgate::cli`).

/// mimalloc instead of glibc's allocator: a request allocates and frees many small buffers (HTTP/2
/// frames, protobuf messages, keys), and glibc's malloc was about 12% of the server's CPU under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
