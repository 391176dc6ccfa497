//! Structured output on SmolLM2-135M (real weights, emulator): 20 JSON schemas, each
//! generated greedily and with seeded sampling, every output checked by an independent
//! validator (the `jsonschema` crate); grammars that cannot match are errors, not hangs.
//!
//! The model is loaded once through the library (the CLI path is covered by one run at the
//! end). The bundle comes from scripts/build-bundle.sh (scripts/test.sh sets
//! QHX_SMOLLM2_BUNDLE); a missing bundle is a failure, not a skip.

mod common;

use common::*;
use qhx::bundle::Spec;
use qhx::chat::Message;
use qhx::engine::{FinishReason, GenConfig};
use qhx::grammar::{self, Vocab};
use qhx::load::LoadOptions;
use qhx::load::Loaded;
use qhx::sampler::SamplerConfig;
use qhx::text::{TextDriver, TextOptions};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

fn bundle_dir() -> PathBuf {
    smollm2_dir()
}

/// Twenty schemas: nested objects, arrays, enums, numbers with bounds, required fields.
/// Strings and arrays are bounded so that every output completes within the token budget.
fn schemas() -> Vec<(&'static str, serde_json::Value)> {
    let s = |n: u32| json!({"type": "string", "maxLength": n});
    vec![
        (
            "a person",
            json!({"type": "object", "properties": {"name": s(16), "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "a city",
            json!({"type": "object", "properties": {"city": s(16), "country": s(16)}, "required": ["city", "country"], "additionalProperties": false}),
        ),
        (
            "a colour",
            json!({"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"], "additionalProperties": false}),
        ),
        (
            "a yes or no answer",
            json!({"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"], "additionalProperties": false}),
        ),
        (
            "three numbers",
            json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999}, "minItems": 3, "maxItems": 3}),
        ),
        (
            "a list of fruits",
            json!({"type": "object", "properties": {"fruits": {"type": "array", "items": s(12), "minItems": 1, "maxItems": 3}}, "required": ["fruits"], "additionalProperties": false}),
        ),
        (
            "a book",
            json!({"type": "object", "properties": {"title": s(24), "year": {"type": "integer", "minimum": 1000, "maximum": 2100}, "author": {"type": "object", "properties": {"first": s(12), "last": s(12)}, "required": ["first", "last"], "additionalProperties": false}}, "required": ["title", "year", "author"], "additionalProperties": false}),
        ),
        (
            "a temperature",
            json!({"type": "object", "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 60}, "unit": {"const": "C"}}, "required": ["celsius", "unit"], "additionalProperties": false}),
        ),
        (
            "a weekday",
            json!({"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]}),
        ),
        (
            "a point",
            json!({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": false}),
        ),
        (
            "a to-do item",
            json!({"type": "object", "properties": {"task": s(24), "done": {"type": "boolean"}, "priority": {"enum": [1, 2, 3]}}, "required": ["task", "done", "priority"], "additionalProperties": false}),
        ),
        (
            "an order",
            json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"sku": s(8), "qty": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["sku", "qty"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}}, "required": ["items"], "additionalProperties": false}),
        ),
        ("a greeting", json!({"type": "string", "maxLength": 24})),
        (
            "an integer",
            json!({"type": "integer", "minimum": -100, "maximum": 100}),
        ),
        (
            "a tag list",
            json!({"type": "array", "items": {"enum": ["news", "sport", "music", "art"]}, "maxItems": 3}),
        ),
        (
            "a user with optional email",
            json!({"type": "object", "properties": {"user": s(12), "email": s(24)}, "required": ["user"], "additionalProperties": false}),
        ),
        (
            "a matrix",
            json!({"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
        ),
        (
            "a status",
            json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"type": "integer", "minimum": 100, "maximum": 599}, "message": s(20)}, "required": ["ok", "code"], "additionalProperties": false}),
        ),
        (
            "a nullable note",
            json!({"type": "object", "properties": {"note": {"anyOf": [s(16), {"type": "null"}]}}, "required": ["note"], "additionalProperties": false}),
        ),
        (
            "a pet",
            json!({"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}, "name": s(12), "legs": {"type": "integer", "minimum": 0, "maximum": 4}}, "required": ["kind", "name", "legs"], "additionalProperties": false}),
        ),
    ]
}

#[test]
fn every_output_validates_against_its_schema_greedy_and_sampled() {
    let d = bundle_dir();
    let lib = emu();
    let spec = Spec::load(&d.join("smollm2.json"), &d).unwrap();
    let model = Loaded::load(&spec, &lib, &lib, &LoadOptions::default()).expect("load");
    let eos = model.eos();
    let vocab =
        Arc::new(Vocab::load(spec.tokenizer_path(), spec.vocab(), spec.declared_eos()[0]).unwrap());
    let tmpl = spec.chat_template(Some(model.tokenizer())).unwrap();
    let mut engine = qhx::engine::Engine::new(model.model()).unwrap();
    let mut failures = Vec::new();
    let mut runs = 0;
    for (what, schema) in schemas() {
        let validator = jsonschema::validator_for(&schema).expect("a valid schema");
        for sampled in [false, true] {
            let opts = TextOptions {
                grammar: Some((vocab.clone(), grammar::Spec::JsonSchema(schema.clone()))),
                ..TextOptions::default()
            };
            let session = TextDriver::new(model.tokenizer(), &eos, opts);
            let msgs = vec![Message::new("user", &format!("Reply with {what} as JSON."))];
            let ids = tmpl.encode(model.tokenizer(), &msgs, true).unwrap();
            let cfg = GenConfig {
                n_tokens: 160,
                sampler: if sampled {
                    SamplerConfig {
                        temp: 0.8,
                        top_p: 0.95,
                        seed: Some(7),
                        ..SamplerConfig::default()
                    }
                } else {
                    SamplerConfig::default()
                },
                ..GenConfig::greedy(160)
            };
            engine.reset();
            let turn = session
                .generate(&mut engine, &ids, &cfg, 160, 0.0, None)
                .unwrap_or_else(|e| panic!("{what} (sampled {sampled}): {e}"));
            runs += 1;
            let label = format!("{what} (sampled {sampled}): {:?}", turn.text);
            if turn.finish != FinishReason::Eos {
                failures.push(format!("{label}: finish {}", turn.finish.as_str()));
                continue;
            }
            // The end token ends the run and never shows as text.
            assert!(
                eos.contains(turn.output.output_ids.last().unwrap()),
                "{label}"
            );
            match serde_json::from_str::<serde_json::Value>(&turn.text) {
                Ok(v) => {
                    if let Err(e) = validator.validate(&v) {
                        failures.push(format!("{label}: invalid: {e}"));
                    }
                }
                Err(e) => failures.push(format!("{label}: not JSON: {e}")),
            }
        }
    }
    println!("structured output: {runs} runs, {} failed", failures.len());
    assert_eq!(runs, 40);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn grammars_that_cannot_match_or_do_not_parse_are_usage_errors() {
    let d = bundle_dir();
    let m = d.join("smollm2.json");
    for (flag, text, needle) in [
        ("--grammar", "start: x\nx: x \"a\"", "matches nothing"),
        ("--grammar", "start: (", "structured output"),
        ("--grammar", "root ::= [", "structured output"),
        ("-j", "{\"type\": \"objekt\"}", "structured output"),
        ("-j", "{not json", "not JSON"),
        // A bad regex is named by its place in the schema, as written there (llguidance's
        // own report shows its rewrite, `\d` as `[0-9]`), with where it fails.
        (
            "-j",
            r#"{"type": "object", "properties": {"name": {"type": "string", "pattern": "\\d+(ab"}}}"#,
            r#"--json-schema: structured output: JSON schema /properties/name/pattern: regex "\\d+(ab" does not parse: unclosed group at column 4 ("(")"#,
        ),
        (
            "--grammar",
            "start: x\nx: /ab(/",
            r#"--grammar: structured output: at 2(4): invalid regex "ab(" (in regex): unclosed group at column 3 ("(")"#,
        ),
    ] {
        let o = generate(&m, &d, "8", "hi", &[flag, text], &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{text:?}: {err}");
        assert!(err.contains(needle), "{text:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{text:?}: {err}");
        assert!(o.stdout.is_empty());
    }
}

/// A schema file's bad regex names the file, the schema path and the regex; nothing loads.
#[test]
fn a_bad_regex_in_a_schema_file_names_the_file_and_the_place() {
    let d = bundle_dir();
    let dir = tmp("bad-regex-schema-file");
    let f = dir.join("id.json");
    let schema = json!({"type": "object", "properties": {"items": {"type": "array",
        "items": {"type": "object", "properties": {"id": {"type": "string",
        "pattern": "^[A-Z]{3}-(\\d{4}$"}}}}}});
    std::fs::write(&f, serde_json::to_vec_pretty(&schema).unwrap()).unwrap();
    let o = generate(
        &d.join("smollm2.json"),
        &d,
        "8",
        "hi",
        &["--json-schema-file", f.to_str().unwrap()],
        &[],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let want = format!(
        "--json-schema-file {}: structured output: JSON schema \
         /properties/items/items/properties/id/pattern: regex \"^[A-Z]{{3}}-(\\\\d{{4}}$\" does \
         not parse: unclosed group at column 11 (\"(\")",
        f.display()
    );
    assert!(err.contains(&want), "{err}\nwant {want}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(o.stdout.is_empty());
}

/// `--spec lookup` under a JSON schema and a GBNF grammar: the drafts are cut at the first
/// token the grammar refuses and each verify row is picked under the grammar's mask, so
/// the output is the plain constrained run's, token for token, while drafts are kept.
#[test]
fn speculation_under_a_grammar_gives_the_plain_constrained_output() {
    let d = bundle_dir();
    let m = d.join("smollm2.json");
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "string"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"], "additionalProperties": false});
    let schema_text = schema.to_string();
    let gbnf = "root ::= item (\", \" item){5,9} \".\"\nitem ::= [a-z]{2,6} \" \" [a-z]{2,6}";
    let cases: [(&str, &str, &str); 2] = [
        (
            "-j",
            &schema_text,
            // Lookup drafts `42` after `"age": ` from the prompt; the schema wants a string.
            r#"Copy this record as JSON: {"name": "Ann Lee", "age": 42, "city": "Paris"}"#,
        ),
        (
            "--grammar",
            gbnf,
            "Repeat these words: red fox, blue cat, green dog, red fox, blue cat, green dog",
        ),
    ];
    let (mut drafted, mut accepted, mut refused) = (0, 0, 0);
    for (flag, g, prompt) in cases {
        let run = |extra: &[&str]| {
            let args = [&["--chat", "--json", flag, g][..], extra].concat();
            let o = generate(&m, &d, "60", prompt, &args, &[]);
            assert!(o.status.success(), "{flag} {extra:?}: {}", stderr(&o));
            (json(&o), stderr(&o))
        };
        let (plain, _) = run(&[]);
        let (spec, err) = run(&["--spec", "lookup", "--spec-adaptive", "off"]);
        assert!(!err.contains("decodes plainly"), "{err}");
        for k in ["output_ids", "text", "finish_reason"] {
            assert_eq!(plain[k], spec[k], "{flag}: {k}");
        }
        assert_eq!(plain["finish_reason"], "eos", "{flag}: {plain}");
        let s = &spec["spec"];
        assert_eq!(s["type"], "lookup", "{s}");
        assert!(s["verifies"].as_u64().unwrap() > 0, "{flag}: {s}");
        drafted += s["drafted"].as_u64().unwrap();
        accepted += s["accepted"].as_u64().unwrap();
        refused += s["refused"].as_u64().unwrap();
        if flag == "-j" {
            let v: serde_json::Value =
                serde_json::from_str(plain["text"].as_str().unwrap()).expect("JSON output");
            assert!(jsonschema::is_valid(&schema, &v), "{v}");
        }
    }
    assert!(
        drafted > 0 && accepted > 0 && refused > 0,
        "drafted {drafted}, accepted {accepted}, refused {refused}"
    );
}

#[test]
fn a_gbnf_grammar_on_the_command_line_shapes_the_output() {
    let d = bundle_dir();
    let g = "root ::= \"The answer is \" answer \".\"\nanswer ::= \"yes\" | \"no\"";
    let o = generate(
        &d.join("smollm2.json"),
        &d,
        "32",
        "Is Paris in France?",
        &["--chat", "--grammar", g, "--json"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let text = v["text"].as_str().unwrap();
    assert!(
        text == "The answer is yes." || text == "The answer is no.",
        "{text:?}"
    );
    assert_eq!(v["finish_reason"], "eos");
}

/// Two tools whose arguments the test validates against their own `parameters`.
fn tool_specs() -> serde_json::Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "description": "Get the local time in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 24}},
                "required": ["city"], "additionalProperties": false}}}
    ])
}

#[test]
fn tool_calls_are_parsed_and_match_the_spec() {
    let d = bundle_dir();
    let m = d.join("smollm2.json");
    let specs = tool_specs();
    let f = tmp("tool-specs").join("tools.json");
    std::fs::write(&f, specs.to_string()).unwrap();
    let f = f.to_string_lossy().into_owned();
    let mut names = Vec::new();
    for (prompt, extra) in [
        ("What's the weather like in Paris right now?", vec![]),
        (
            "What time is it in Tokyo?",
            vec!["--temp", "0.8", "--seed", "7"],
        ),
    ] {
        let mut args = vec!["--tools", f.as_str(), "--tool-choice", "required", "--json"];
        args.extend(extra);
        let o = generate(&m, &d, "64", prompt, &args, &[]);
        assert!(o.status.success(), "{prompt}: {}", stderr(&o));
        let v = json(&o);
        let text = v["text"].as_str().unwrap();
        assert!(
            !text.contains("<|im_end|>"),
            "the end token leaked: {text:?}"
        );
        let calls = v["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{prompt}: {text:?} -> {calls:?}");
        let call = &calls[0];
        assert_eq!(call["type"], "function");
        let name = call["function"]["name"].as_str().unwrap();
        let spec = specs
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["function"]["name"] == name)
            .unwrap_or_else(|| panic!("{prompt}: {name:?} is not one of the tools"));
        // OpenAI's shape: arguments as a JSON string, valid against the tool's parameters.
        let args: serde_json::Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        let validator = jsonschema::validator_for(&spec["function"]["parameters"]).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&args)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{prompt}: {args} -> {errors:?}");
        names.push(name.to_string());
    }
    println!("tool calls: {names:?}");
    // The weather question calls get_weather (the model's greedy pick).
    assert_eq!(names[0], "get_weather");

    // tool-choice auto: plain text is allowed, and it cannot begin a malformed call.
    let o = generate(
        &m,
        &d,
        "16",
        "Hi! Tell me a joke.",
        &["--tools", f.as_str(), "--json"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let text = v["text"].as_str().unwrap();
    let calls = v["tool_calls"].as_array().unwrap();
    assert!(
        !text.starts_with('<') || !calls.is_empty(),
        "auto: a reply starting like a call must be one: {text:?}"
    );
    assert!(!text.is_empty(), "auto: no text");
}

#[test]
fn tool_flags_are_checked_before_loading() {
    let d = bundle_dir();
    let m = d.join("smollm2.json");
    let dir = tmp("tool-flags");
    let dup = dir.join("dup.json");
    std::fs::write(&dup, r#"[{"name": "a"}, {"name": "a"}]"#).unwrap();
    let dup = dup.to_string_lossy().into_owned();
    let missing = dir.join("missing.json").to_string_lossy().into_owned();
    for (args, needle) in [
        (vec!["--tools", dup.as_str()], "two tools are named"),
        (vec!["--tools", missing.as_str()], "--tools"),
        (
            vec!["--tool-choice", "required"],
            "--tool-choice needs --tools",
        ),
        (
            vec!["--tools", dup.as_str(), "-j", "{}"],
            "cannot be used with",
        ),
    ] {
        let o = generate(&m, &d, "8", "hi", &args, &[]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(o.stdout.is_empty());
    }
}

/// Speculative decoding verifies k drafted tokens at once and rolls the grammar back over
/// the rejected ones: after `rollback(k)` the allowed set is the one k tokens earlier, and
/// committing the same tokens again lands in the same state.
#[test]
fn grammar_rollback_restores_the_earlier_allowed_sets() {
    let d = bundle_dir();
    let spec = Spec::load(&d.join("smollm2.json"), &d).unwrap();
    let tok = qhx::tokenizer::Tokenizer::load(spec.tokenizer_path()).unwrap();
    let vocab = Vocab::load(spec.tokenizer_path(), spec.vocab(), spec.declared_eos()[0]).unwrap();
    let schema = json!({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
    let mut c = grammar::Constraint::new(&vocab, &grammar::Spec::JsonSchema(schema)).unwrap();
    let ids = tok.encode_raw(r#"{"name": "Ann Lee", "age": 42}"#).unwrap();
    assert!(ids.len() >= 8, "{ids:?}");
    let allowed = |c: &grammar::Constraint| -> Vec<u32> {
        (0..spec.vocab() as u32).filter(|&t| c.allows(t)).collect()
    };
    let mut before = Vec::new();
    for &t in &ids {
        before.push(allowed(&c));
        assert!(c.allows(t), "token {t} of a valid document is not allowed");
        c.commit(t).unwrap();
    }
    let end = allowed(&c);
    assert_eq!(
        end,
        vec![spec.declared_eos()[0]],
        "a complete document allows only the end"
    );
    for k in [1, 3, 6] {
        c.rollback(k).unwrap();
        assert_eq!(allowed(&c), before[ids.len() - k], "rollback({k})");
        for &t in &ids[ids.len() - k..] {
            c.commit(t).unwrap();
        }
        assert_eq!(allowed(&c), end, "recommitting {k} tokens");
    }
}
