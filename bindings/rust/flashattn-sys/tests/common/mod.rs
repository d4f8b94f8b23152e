//! The text parsers the header tests share (tests/header.rs for flashattn.h against src/lib.rs,
//! tests/cp_header.rs for flashattn_cp.h against src/cp.rs): both files are parsed as text (the
//! headers are C99 in one regular style).
#![allow(dead_code)] // each test crate uses its own subset
use std::collections::BTreeMap;

pub fn strip_c_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

pub fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// "const  char *" -> "const char*", "flashattn_plan_t **" -> "flashattn_plan_t**"
pub fn normalize_c_type(t: &str) -> String {
    let mut t = squash(t);
    while t.contains(" *") || t.contains("* ") {
        t = t.replace(" *", "*").replace("* ", "*");
    }
    t
}

pub type Signature = (String, Vec<String>); // (return type, parameter types), C spelling

pub fn parse_header_functions(text: &str) -> BTreeMap<String, Signature> {
    let text = strip_c_comments(text);
    let mut out = BTreeMap::new();
    for chunk in text.split("FLASHATTN_API").skip(1) {
        let decl = &chunk[..chunk.find(';').expect("declaration without ';'")];
        let open = decl.find('(').expect("declaration without '('");
        let close = decl.rfind(')').expect("declaration without ')'");
        let head = decl[..open].trim();
        let name_start = head.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        let name = head[name_start..].to_string();
        let ret = normalize_c_type(&head[..name_start]);
        let params = decl[open + 1..close].trim();
        let mut types = Vec::new();
        if params != "void" {
            for p in params.split(',') {
                let p = p.trim();
                let ident_start = p.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                assert!(ident_start > 0, "{name}: unnamed parameter {p:?}");
                types.push(normalize_c_type(&p[..ident_start]));
            }
        }
        assert!(name.starts_with("flashattn_"), "unexpected declaration {decl:?}");
        out.insert(name, (ret, types));
    }
    out
}

pub fn parse_header_enums(text: &str) -> BTreeMap<String, BTreeMap<String, i64>> {
    let text = strip_c_comments(text);
    let mut out = BTreeMap::new();
    for chunk in text.split("typedef enum").skip(1) {
        let open = chunk.find('{').unwrap();
        let close = chunk.find('}').unwrap();
        let name = chunk[close + 1..chunk.find(';').unwrap()].trim().to_string();
        let mut values = BTreeMap::new();
        let mut next = 0i64;
        for item in chunk[open + 1..close].split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (n, v) = match item.split_once('=') {
                Some((n, v)) => (n.trim(), v.trim().parse::<i64>().expect("enum value")),
                None => (item, next),
            };
            values.insert(n.to_string(), v);
            next = v + 1;
        }
        out.insert(name, values);
    }
    out
}

/// A Rust FFI type spelled the way the header spells the C type.
pub fn rust_to_c(t: &str, enums: &[&str]) -> String {
    let t = squash(t);
    if let Some(rest) = t.strip_prefix("*mut ") {
        return format!("{}*", rust_to_c(rest, enums));
    }
    if let Some(rest) = t.strip_prefix("*const ") {
        let inner = rust_to_c(rest, enums);
        return if inner.ends_with('*') { format!("{inner}const*") } else { format!("const {inner}*") };
    }
    match t.as_str() {
        "c_char" => "char".into(),
        "c_void" => "void".into(),
        "usize" => "size_t".into(),
        "i64" => "int64_t".into(),
        "i32" => "int32_t".into(),
        "u32" => "uint32_t".into(),
        "u64" => "uint64_t".into(),
        "f64" => "double".into(),
        "f32" => "float".into(),
        "()" => "void".into(),
        other if other.starts_with("flashattn_") => other.into(),
        other => panic!("unknown Rust FFI type {other:?} in src/lib.rs (enums: {enums:?})"),
    }
}

pub fn parse_rust_functions(text: &str, enums: &[&str]) -> BTreeMap<String, Signature> {
    let block_start = text.find("extern \"C\" {").expect("no extern \"C\" block in src/lib.rs");
    let block = &text[block_start..];
    let block = &block[..block.find("\n}").unwrap()];
    let mut out = BTreeMap::new();
    for chunk in block.split("pub fn ").skip(1) {
        let decl = squash(&chunk[..chunk.find(';').unwrap()]);
        let open = decl.find('(').unwrap();
        let close = decl.rfind(')').unwrap();
        let name = decl[..open].trim().to_string();
        let ret = decl[close + 1..].trim().strip_prefix("->").map_or("()".to_string(), |r| r.trim().to_string());
        let types = decl[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| rust_to_c(p.split_once(':').expect("parameter without type").1, enums))
            .collect();
        out.insert(name, (rust_to_c(&ret, enums), types));
    }
    out
}

pub fn parse_rust_consts(text: &str) -> BTreeMap<String, (String, i64)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else { continue };
        let (name, rest) = rest.split_once(':').unwrap();
        let (ty, value) = rest.split_once('=').unwrap();
        let value = value.trim().trim_end_matches(';').parse::<i64>().unwrap();
        out.insert(name.trim().to_string(), (ty.trim().to_string(), value));
    }
    out
}

/// Every function `header` declares is declared in `rust` (the text of `file`) with the same
/// return type and argument types, and no other; `count` pins the header's number of functions so
/// a parse that silently finds fewer fails.
pub fn assert_functions_match(header: &str, rust: &str, file: &str, count: usize) {
    let enums = parse_header_enums(header);
    let enum_names: Vec<&str> = enums.keys().map(String::as_str).collect();
    let c = parse_header_functions(header);
    let rust = parse_rust_functions(rust, &enum_names);
    assert_eq!(c.len(), count, "the header declares {} functions; update this test and {file}", c.len());
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

/// Every enum value of `header` is a constant of `rust` (the text of `file`) with its type and
/// value, and `rust` declares no other constant.
pub fn assert_enums_match(header: &str, rust: &str, file: &str) {
    let enums = parse_header_enums(header);
    let consts = parse_rust_consts(rust);
    let mut count = 0;
    for (typedef, values) in &enums {
        for (name, value) in values {
            let (ty, rvalue) = consts.get(name).unwrap_or_else(|| panic!("{name} is not declared in {file}"));
            assert_eq!(ty, typedef, "{name}: type");
            assert_eq!(rvalue, value, "{name}: value");
            count += 1;
        }
    }
    assert_eq!(count, consts.len(), "{file} declares constants the header does not have");
}
