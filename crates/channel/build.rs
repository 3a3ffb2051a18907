//! Builds the UCX shim (csrc/ucx_shim.c) when the `ucx` feature is on; does
//! nothing otherwise.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "ucx")]
    ucx::build();
}

#[cfg(feature = "ucx")]
mod ucx {
    pub fn build() {
        println!("cargo:rerun-if-changed=csrc/ucx_shim.c");
        let lib = match pkg_config::Config::new()
            .atleast_version("1.10")
            .cargo_metadata(false)
            .probe("ucx")
        {
            Ok(lib) => lib,
            Err(e) => {
                eprintln!(
                    "\nerror: the `ucx` feature of rlinf-channel needs UCX's development files \
                     (ucx.pc, ucp/api/ucp.h), and pkg-config cannot find them: {e}\n\
                     Install them with `apt-get install libucx-dev` (Debian/Ubuntu), or set \
                     PKG_CONFIG_PATH to a UCX installation, or build without `--features ucx`.\n"
                );
                std::process::exit(1);
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
        // Link UCX after the static shim (which calls into it), so the
        // linker resolves the shim's symbols against it.
        for dir in &lib.link_paths {
            println!("cargo:rustc-link-search=native={}", dir.display());
        }
        for name in &lib.libs {
            println!("cargo:rustc-link-lib=dylib={name}");
        }
    }
}
