//! Checks a `--json` report against its committed schema (docs/schema/<cmd>.schema.json), for
//! the subset of JSON Schema our schemas use: type, const, enum, minimum, required, properties,
//! items, additionalProperties (false or a schema), and `$ref` into `$defs`.

use serde_json::Value;

/// The committed schema of a command's `--json` output.
pub fn load(cmd: &str) -> Value {
    let path = format!(
        "{}/../../docs/schema/{cmd}.schema.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Panics with the path of the first value the schema rejects.
pub fn check(schema: &Value, v: &Value, at: &str) {
    walk(schema, schema, v, at);
}

/// Checks `v` against one part of `root` (e.g. `root["properties"]["checks"]`), following
/// `$ref`s into `root`'s `$defs`.
pub fn check_part(root: &Value, part: &Value, v: &Value, at: &str) {
    walk(root, part, v, at);
}

fn walk(root: &Value, schema: &Value, v: &Value, at: &str) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/$defs/");
        return walk(root, &root["$defs"][name], v, at);
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let ty = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let ok =
        types.is_empty() || types.contains(&ty) || (ty == "integer" && types.contains(&"number"));
    assert!(ok, "{at}: {ty} where the schema says {types:?}");
    if let Some(c) = schema.get("const") {
        assert_eq!(c, v, "{at}: const");
    }
    if let Some(Value::Array(e)) = schema.get("enum") {
        assert!(e.contains(v), "{at}: {v} not in {e:?}");
    }
    if let (Some(min), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        assert!(n >= min, "{at}: {n} < {min}");
    }
    if let (Some(items), Value::Array(a)) = (schema.get("items"), v) {
        for (i, x) in a.iter().enumerate() {
            walk(root, items, x, &format!("{at}[{i}]"));
        }
    }
    if let Value::Object(obj) = v {
        for r in schema["required"].as_array().into_iter().flatten() {
            assert!(obj.contains_key(r.as_str().unwrap()), "{at}: missing {r}");
        }
        let props = schema["properties"].as_object();
        for (k, val) in obj {
            match (
                props.and_then(|p| p.get(k)),
                &schema["additionalProperties"],
            ) {
                (Some(s), _) => walk(root, s, val, &format!("{at}.{k}")),
                (None, Value::Bool(false)) => panic!("{at}: unknown field {k}"),
                (None, extra @ Value::Object(_)) => walk(root, extra, val, &format!("{at}.{k}")),
                (None, _) => {}
            }
        }
    }
}

#[test]
fn the_checker_rejects_what_it_should() {
    let schema: Value = serde_json::json!({
        "type": "object", "additionalProperties": false, "required": ["n"],
        "properties": {"n": {"type": "integer", "minimum": 0}, "k": {"enum": ["a", "b"]}}
    });
    check(&schema, &serde_json::json!({"n": 1, "k": "a"}), "ok");
    for bad in [
        serde_json::json!({"n": 1, "x": 2}),
        serde_json::json!({"n": "1"}),
        serde_json::json!({"n": -1}),
        serde_json::json!({"k": "a"}),
        serde_json::json!({"n": 1, "k": "c"}),
    ] {
        assert!(
            std::panic::catch_unwind(|| check(&schema, &bad, "bad")).is_err(),
            "{bad} passed"
        );
    }
}
