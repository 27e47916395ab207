//! The schemas a model reads and the arguments they admit, without a daemon: the server is
//! built unconfigured, which is all `tools/list` needs.

use serde_json::{Value, json};

use super::params::{Bounded, ContextLines, EditArgs, EntryGeneration, ListArgs, PageLimit};
use super::*;

fn args(workspace: Option<&str>) -> McpArgs {
    McpArgs {
        workspace: workspace.map(String::from),
        read_only: false,
        allow_restore: false,
        local_root: Some(PathBuf::from("none")),
    }
}

fn unconfigured() -> ClientError {
    ClientError::local("no CA certificate: pass --ca")
}

/// Every tool's input schema, by name.
fn schemas(workspace: Option<&str>) -> Vec<(String, Value)> {
    let mcp = NokvMcp::new(Err(unconfigured()), args(workspace)).unwrap();
    mcp.tool_router
        .list_all()
        .into_iter()
        .map(|t| (t.name.to_string(), Value::Object((*t.input_schema).clone())))
        .collect()
}

#[test]
fn without_a_pinned_workspace_every_schema_requires_a_workspace_string() {
    let tools = schemas(None);
    assert_eq!(tools.len(), 10, "every tool but the two local-file ones");
    for (name, s) in tools {
        let required: Vec<&str> = s["required"]
            .as_array()
            .unwrap_or_else(|| panic!("{name}: no required list"))
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(required.contains(&"workspace"), "{name}: {required:?}");
        assert_eq!(s["properties"]["workspace"]["type"], "string", "{name}");
    }
}

#[test]
fn a_pinned_workspace_is_neither_a_property_nor_required() {
    for (name, s) in schemas(Some("agent")) {
        assert!(s["properties"].get("workspace").is_none(), "{name}");
        let required = s.get("required").and_then(Value::as_array);
        assert!(
            !required.is_some_and(|r| r.iter().any(|v| v == "workspace")),
            "{name}"
        );
    }
}

#[test]
fn no_schema_advertises_expected_generation() {
    for (name, s) in schemas(None) {
        assert!(!s.to_string().contains("expected_generation"), "{name}");
    }
}

#[test]
fn every_integer_property_has_a_minimum() {
    for (name, s) in schemas(None) {
        for (prop, p) in s["properties"].as_object().unwrap() {
            if p["type"].to_string().contains("integer") {
                assert!(p["minimum"].is_u64(), "{name}.{prop}: {p}");
                assert!(p.get("format").is_none(), "{name}.{prop}: {p}");
            }
        }
    }
}

#[test]
fn edit_takes_if_generation_or_its_alias_expected_generation_but_not_both() {
    let base = json!({"workspace": "w", "path": "p", "old": "a", "new": "b"});
    let with = |k: &str| {
        let mut v = base.clone();
        v[k] = json!(7);
        serde_json::from_value::<EditArgs>(v)
    };
    assert_eq!(
        with("if_generation").unwrap().if_generation.unwrap().get(),
        7
    );
    assert_eq!(
        with("expected_generation")
            .unwrap()
            .if_generation
            .unwrap()
            .get(),
        7
    );
    let mut both = base.clone();
    both["if_generation"] = json!(7);
    both["expected_generation"] = json!(7);
    let e = serde_json::from_value::<EditArgs>(both).unwrap_err();
    assert!(e.to_string().contains("duplicate field"), "{e}");
}

#[test]
fn a_bounded_argument_admits_its_range_and_refuses_the_rest_naming_itself() {
    let page = |v: Value| Bounded::<PageLimit>::new(&v).map(|b| b.get());
    assert_eq!(page(json!(1)), Ok(1));
    assert_eq!(page(json!(1000)), Ok(1000));
    for bad in [
        json!(0),
        json!(1001),
        json!(-1),
        json!(1.5),
        json!("5"),
        json!(null),
    ] {
        let e = page(bad.clone()).unwrap_err();
        assert_eq!(
            e,
            format!("limit must be an integer from 1 to 1000, not {bad}")
        );
    }
    let context = |v: Value| Bounded::<ContextLines>::new(&v).map(|b| b.get());
    assert_eq!(context(json!(0)), Ok(0));
    assert!(
        context(json!(11))
            .unwrap_err()
            .starts_with("context_lines ")
    );
    let generation = |v: Value| Bounded::<EntryGeneration>::new(&v).map(|b| b.get());
    assert_eq!(generation(json!(u64::MAX)), Ok(u64::MAX));
    assert_eq!(
        generation(json!(0)).unwrap_err(),
        "if_generation must be an integer of at least 1, not 0"
    );
}

#[test]
fn an_out_of_range_argument_fails_while_the_arguments_are_parsed() {
    let e =
        serde_json::from_value::<ListArgs>(json!({"workspace": "w", "limit": 5000})).unwrap_err();
    assert!(
        e.to_string()
            .contains("limit must be an integer from 1 to 1000"),
        "{e}"
    );
    let ok = serde_json::from_value::<ListArgs>(json!({"workspace": "w", "limit": null})).unwrap();
    assert!(ok.limit.is_none());
}

#[test]
fn an_unconfigured_server_names_the_problem_and_the_fix() {
    let mcp = NokvMcp::new(Err(unconfigured()), args(None)).unwrap();
    let e = mcp.client().err().expect("no client");
    for part in [
        "no CA certificate",
        "NOKV_ENDPOINT",
        "NOKV_CA",
        "NOKV_TOKEN",
        "NOKV_CONFIG",
        "restart",
    ] {
        assert!(e.message.contains(part), "{part}: {}", e.message);
    }
}

#[test]
fn every_path_glob_regex_and_content_property_publishes_the_daemons_length_limit() {
    let mut seen = 0;
    for (name, s) in schemas(None) {
        for (prop, p) in s["properties"].as_object().unwrap() {
            let limit = match prop.as_str() {
                "path" | "prefix" => nokv_proto::MAX_PATH_BYTES,
                "glob" | "path_glob" => nokv_proto::MAX_GLOB_BYTES,
                "regex" => nokv_proto::MAX_REGEX_BYTES,
                "content" => nokv_client::sdk::INLINE_MAX,
                _ => continue,
            };
            assert_eq!(p["maxLength"], limit, "{name}.{prop}: {p}");
            seen += 1;
        }
    }
    assert_eq!(
        seen, 12,
        "6 paths (publish and restore are not listed here), a prefix, a glob, a path glob, a regex \
         and the content of a write and of an append"
    );
}
