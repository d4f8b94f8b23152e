//! Keeps src/cp.rs in line with include/flashattn/flashattn_cp.h, as tests/header.rs does for the
//! core: every function the header declares is declared in src/cp.rs with the same argument
//! count and types, and every enum value matches. Text only (src/cp.rs is compiled with the
//! feature "cp"; its linking is what the flashattn crate's cp tests exercise).
mod common;

use common::*;
use std::path::PathBuf;

const CP_RS: &str = include_str!("../src/cp.rs");

fn header_text() -> String {
    let path = match std::env::var_os("FLASHATTN_CP_HEADER") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/flashattn/flashattn_cp.h"),
    };
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn every_cp_function_is_declared_with_the_same_signature() {
    let header = header_text();
    let enums = parse_header_enums(&header);
    let enum_names: Vec<&str> = enums.keys().map(String::as_str).collect();
    let c = parse_header_functions(&header);
    let rust = parse_rust_functions(CP_RS, &enum_names);
    assert_eq!(c.len(), 10, "flashattn_cp.h declares {} functions; update this test and src/cp.rs", c.len());
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
fn every_cp_enum_value_matches() {
    let header = header_text();
    let enums = parse_header_enums(&header);
    let consts = parse_rust_consts(CP_RS);
    let mut count = 0;
    for (typedef, values) in &enums {
        for (name, value) in values {
            let (ty, rvalue) = consts.get(name).unwrap_or_else(|| panic!("{name} is not declared in src/cp.rs"));
            assert_eq!(ty, typedef, "{name}: type");
            assert_eq!(rvalue, value, "{name}: value");
            count += 1;
        }
    }
    assert_eq!(count, consts.len(), "src/cp.rs declares constants the header does not have");
}
