//! `rlinf-ucx-home`: the UCX home helper of one channel-agent connection
//! (see `rlinf_channel::transport::ucx_home`). Speaks frames on stdin/stdout;
//! exits when stdin ends.

#[cfg(rlinf_ucx)]
fn main() {
    std::process::exit(rlinf_channel::transport::ucx_home::serve_stdio());
}

#[cfg(not(rlinf_ucx))]
fn main() {
    eprintln!("rlinf-ucx-home: built without UCX (its headers were not found)");
    std::process::exit(1);
}
