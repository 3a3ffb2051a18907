//! PyO3 bindings: the `rlinf.core._native` extension module.
//!
//! Only thin wrappers live here; all logic is in the plain-Rust modules so
//! that `cargo test` covers it without a Python interpreter.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Version of the native extension (the `rlinf-channel` crate).
#[pyfunction]
fn version() -> &'static str {
    crate::VERSION
}

/// Shared-memory segment name for `channel` in run `namespace`.
///
/// Raises ValueError naming the bad part, character and fix.
#[pyfunction]
fn segment_name(namespace: &str, channel: &str) -> PyResult<String> {
    crate::naming::segment_name(namespace, channel)
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Splits a segment name into `(namespace, channel)`, or returns None for
/// names RLinf did not build.
#[pyfunction]
fn parse_segment_name(name: &str) -> Option<(String, String)> {
    crate::naming::parse_segment_name(name).map(|(n, c)| (n.to_owned(), c.to_owned()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(segment_name, m)?)?;
    m.add_function(wrap_pyfunction!(parse_segment_name, m)?)?;
    m.add("SEGMENT_PREFIX", crate::naming::SEGMENT_PREFIX)?;
    Ok(())
}
