//! Keeps src/lib.rs in line with include/flashattn/flashattn.h: every function the header declares
//! is declared here with the same argument count and types, and every enum value matches. Both
//! files are parsed as text (the header is C99 in one regular style); the link test below also
//! makes the linker resolve every declared function against the real library.
mod common;

use common::*;
use std::path::PathBuf;

const LIB_RS: &str = include_str!("../src/lib.rs");

fn header_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLASHATTN_HEADER") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/flashattn/flashattn.h")
}

fn header_text() -> String {
    let path = header_path();
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_header_function_is_declared_with_the_same_signature() {
    assert_functions_match(&header_text(), LIB_RS, "src/lib.rs", 31);
}

#[test]
fn every_enum_value_matches() {
    assert_enums_match(&header_text(), LIB_RS, "src/lib.rs");
}

#[test]
fn compiled_constants_match_the_parsed_text() {
    use flashattn_sys::*;
    // The text parse above reads the same file the compiler does; spot-check a few through the
    // compiler so a formatting change that fooled the parser would show.
    let consts = parse_rust_consts(LIB_RS);
    assert_eq!(consts["FLASHATTN_I64_O_HEAD_STRIDE"].1, FLASHATTN_I64_O_HEAD_STRIDE as i64);
    assert_eq!(consts["FLASHATTN_I64_DV_HEAD_STRIDE"].1, FLASHATTN_I64_DV_HEAD_STRIDE as i64);
    assert_eq!(consts["FLASHATTN_ERROR_INTERNAL"].1, FLASHATTN_ERROR_INTERNAL as i64);
    assert_eq!(consts["FLASHATTN_BACKEND_FA3"].1, FLASHATTN_BACKEND_FA3 as i64);
}

#[test]
fn every_function_links() {
    use flashattn_sys::*;
    let addresses: [usize; 28] = [
        flashattn_status_string as *const () as usize,
        flashattn_last_error as *const () as usize,
        flashattn_last_error_copy as *const () as usize,
        flashattn_version as *const () as usize,
        flashattn_version_string as *const () as usize,
        flashattn_build_info as *const () as usize,
        flashattn_device_count as *const () as usize,
        flashattn_device_compute_capability as *const () as usize,
        flashattn_plan_create as *const () as usize,
        flashattn_plan_destroy as *const () as usize,
        flashattn_plan_set_i64 as *const () as usize,
        flashattn_plan_set_f64 as *const () as usize,
        flashattn_plan_get_i64 as *const () as usize,
        flashattn_plan_get_f64 as *const () as usize,
        flashattn_plan_finalize as *const () as usize,
        flashattn_plan_get_backend as *const () as usize,
        flashattn_plan_get_workspace_size as *const () as usize,
        flashattn_plan_execute as *const () as usize,
        flashattn_plan_execute_varlen as *const () as usize,
        flashattn_plan_get_backward_backend as *const () as usize,
        flashattn_plan_get_backward_workspace_size as *const () as usize,
        flashattn_plan_execute_backward as *const () as usize,
        flashattn_plan_execute_backward_varlen as *const () as usize,
        flashattn_args_create as *const () as usize,
        flashattn_args_destroy as *const () as usize,
        flashattn_args_set as *const () as usize,
        flashattn_args_get as *const () as usize,
        flashattn_plan_execute_args as *const () as usize,
    ];
    assert!(addresses.iter().all(|&a| a != 0));
    assert_eq!(unsafe { flashattn_version() } / 10000, 0, "this crate is for libflashattn 0.x");
}
