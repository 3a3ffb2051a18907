//! Builds the UCX shim (csrc/ucx_shim.c) when the `ucx` feature is on and
//! UCX's development files are found; does nothing otherwise.
//!
//! The shim is compiled against UCX's headers but does not link libucp: it
//! loads the library at run time (`dlopen`), so the built extension imports
//! and runs (TCP only) on a machine without libucx. When the headers are
//! found, the crate is compiled with `--cfg rlinf_ucx`, which turns the UCX
//! transport on; without them the build carries on without UCX (a cargo
//! warning says so) unless `RLINF_REQUIRE_UCX=1` asks for a hard error (CI
//! uses it, so a missing libucx-dev cannot silently skip the UCX tests).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(rlinf_ucx)");
    #[cfg(feature = "ucx")]
    ucx::build();
}

#[cfg(feature = "ucx")]
mod ucx {
    pub fn build() {
        println!("cargo:rerun-if-changed=csrc/ucx_shim.c");
        println!("cargo:rerun-if-env-changed=RLINF_REQUIRE_UCX");
        println!("cargo:rerun-if-env-changed=PKG_CONFIG");
        println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
        let required = std::env::var("RLINF_REQUIRE_UCX").is_ok_and(|v| v == "1");
        let lib = match pkg_config::Config::new()
            .atleast_version("1.10")
            .cargo_metadata(false)
            .env_metadata(false)
            .probe("ucx")
        {
            Ok(lib) => lib,
            Err(e) => {
                let why = format!(
                    "UCX's development files (ucx.pc, ucp/api/ucp.h, UCX >= 1.10) were not \
                     found by pkg-config, so rlinf-channel is built WITHOUT the UCX transport \
                     (RLINF_CHANNEL_TRANSPORT=ucx will report that). Install them with \
                     `apt-get install libucx-dev` (Debian/Ubuntu) or set PKG_CONFIG_PATH to a \
                     UCX installation, then rebuild. pkg-config said: {}",
                    e.to_string().replace('\n', " ")
                );
                if required {
                    eprintln!("\nerror (RLINF_REQUIRE_UCX=1): {why}\n");
                    std::process::exit(1);
                }
                println!("cargo:warning={why}");
                return;
            }
        };
        let mut build = cc::Build::new();
        build
            .file("csrc/ucx_shim.c")
            .warnings(true)
            .extra_warnings(true);
        for dir in &lib.include_paths {
            build.include(dir);
        }
        build.compile("rlinf_ucx_shim");
        // No libucp on the link line: the shim dlopen()s it. dlopen itself is
        // in libc on glibc >= 2.34 and in libdl before (a stub after).
        println!("cargo:rustc-link-lib=dylib=dl");
        println!("cargo:rustc-cfg=rlinf_ucx");
    }
}
