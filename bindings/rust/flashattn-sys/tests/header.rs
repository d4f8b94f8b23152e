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
    let header = header_text();
    let enums = parse_header_enums(&header);
    let enum_names: Vec<&str> = enums.keys().map(String::as_str).collect();
    let c = parse_header_functions(&header);
    let rust = parse_rust_functions(LIB_RS, &enum_names);
    assert_eq!(c.len(), 31, "the header declares {} functions; update this test and src/lib.rs", c.len());
    let c_names: Vec<_> = c.keys().collect();
    let rust_names: Vec<_> = rust.keys().collect();
    assert_eq!(c_names, rust_names, "function sets differ");
    for (name, (ret, params)) in &c {
        let (rret, rparams) = &rust[name];
        assert_eq!(params.len(), rparams.len(), "{name}: argument count");
        assert_eq!(ret, rret, "{name}: return type");
        assert_eq!(params, rparams, "{name}: argument types");
    }
}

#[test]
fn every_enum_value_matches() {
    let header = header_text();
    let enums = parse_header_enums(&header);
    let consts = parse_rust_consts(LIB_RS);
    let mut count = 0;
    for (typedef, values) in &enums {
        for (name, value) in values {
            let (ty, rvalue) = consts.get(name).unwrap_or_else(|| panic!("{name} is not declared in src/lib.rs"));
            assert_eq!(ty, typedef, "{name}: type");
            assert_eq!(rvalue, value, "{name}: value");
            count += 1;
        }
    }
    assert_eq!(count, consts.len(), "src/lib.rs declares constants the header does not have");
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
