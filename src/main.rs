//! The `prunemem` binary: installs the counting allocator (so heap readings
//! exist) and hands over to the command line.

#[global_allocator]
static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;

fn main() {
    std::process::exit(prunemem::cli::main());
}
