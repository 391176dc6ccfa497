//! Tool calls: OpenAI-style tool specs rendered into the prompt, the reply constrained to a
//! tool-call block, and the reply parsed back into calls.
//!
//! The syntax is the one Qwen2.5 / Qwen3 / Hermes templates teach:
//! `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`. A chat template that reads
//! `tools` renders the specs itself; for one that does not, the specs and the syntax go
//! into the system message. The grammar makes the call well-formed whatever the template
//! taught: `name` is one of the tools and `arguments` follows that tool's `parameters`.

use crate::error::{Error, Result};
use serde_json::{json, Value};
use std::path::Path;

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// The tools a request offers.
#[derive(Debug, Clone)]
pub struct Tools {
    /// Each spec as `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub specs: Vec<Value>,
}

/// One parsed call, as OpenAI's API reports it (`arguments` is a JSON string).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolCall {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: Function,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Function {
    pub name: String,
    pub arguments: String,
}

fn bad(msg: impl Into<String>) -> Error {
    Error::Grammar(format!("tools: {}", msg.into()))
}

impl Tools {
    /// Parse tool specs: a JSON array of `{"type": "function", "function": {...}}` or of bare
    /// function objects (`{"name", "description"?, "parameters"?}`).
    pub fn parse(text: &str) -> Result<Tools> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let list = match v {
            Value::Array(a) => a,
            o @ Value::Object(_) => vec![o],
            _ => return Err(bad("expected an array of tool specs")),
        };
        if list.is_empty() {
            return Err(bad("the list is empty"));
        }
        let mut specs = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, t) in list.into_iter().enumerate() {
            let f = match t.get("function") {
                Some(f) => f.clone(),
                None => t,
            };
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| bad(format!("tool {i} has no \"name\"")))?
                .to_string();
            if !names.insert(name.clone()) {
                return Err(bad(format!("two tools are named {name:?}")));
            }
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            if !params.is_object() {
                return Err(bad(format!(
                    "tool {name:?}: \"parameters\" is not a JSON schema object"
                )));
            }
            let mut func = json!({"name": name, "parameters": params});
            if let Some(d) = f.get("description") {
                func["description"] = d.clone();
            }
            specs.push(json!({"type": "function", "function": func}));
        }
        Ok(Tools { specs })
    }

    pub fn load(path: &Path) -> Result<Tools> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Tools::parse(&text).map_err(|e| match e {
            Error::Grammar(m) => Error::File {
                path: path.to_path_buf(),
                msg: m,
            },
            e => e,
        })
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.specs
            .iter()
            .filter_map(|s| s["function"]["name"].as_str())
    }

    /// The system-message text for templates that do not render `tools` themselves.
    pub fn system_text(&self) -> String {
        let mut s = String::from(
            "You may call one of these tools. To call one, reply with only a tool-call block:\n\
             <tool_call>\n{\"name\": <tool name>, \"arguments\": <arguments object>}\n</tool_call>\n\n\
             Tools:\n",
        );
        for spec in &self.specs {
            s.push_str(&spec["function"].to_string());
            s.push('\n');
        }
        s
    }

    /// The grammar of the reply: one tool-call block (`required`), or a tool-call block or
    /// plain text that does not start one.
    pub fn grammar(&self, required: bool) -> crate::grammar::Spec {
        let calls: Vec<Value> = self
            .specs
            .iter()
            .map(|s| {
                let f = &s["function"];
                json!({
                    "type": "object",
                    "properties": {
                        "name": {"const": f["name"]},
                        "arguments": f["parameters"],
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = json!({
            "oneOf": calls,
            "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "},
        });
        let call = format!("call: \"{OPEN}\\n\" %json {schema} \"\\n{CLOSE}\"\n");
        let start = if required {
            "start: call\n".to_string()
        } else {
            // Text that does not begin like a tool-call block ("<" opens one).
            "start: call | TEXT\nTEXT: /[^<\\s][\\s\\S]*/\n".to_string()
        };
        crate::grammar::Spec::Lark(start + &call)
    }

    /// The calls in a reply: every `<tool_call>` block whose body is `{"name", "arguments"}`
    /// naming one of the tools. Blocks that do not parse are left out.
    pub fn parse_calls(&self, text: &str) -> Vec<ToolCall> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find(OPEN) {
            let after = &rest[i + OPEN.len()..];
            let (body, next) = match after.find(CLOSE) {
                Some(j) => (&after[..j], &after[j + CLOSE.len()..]),
                None => (after, ""),
            };
            rest = next;
            let Ok(v) = serde_json::from_str::<Value>(body.trim()) else {
                continue;
            };
            let (Some(name), Some(args)) = (v["name"].as_str(), v.get("arguments")) else {
                continue;
            };
            if self.names().any(|n| n == name) {
                out.push(ToolCall {
                    kind: "function",
                    function: Function {
                        name: name.to_string(),
                        arguments: args.to_string(),
                    },
                });
            }
        }
        out
    }
}

/// Render a conversation with `tools` offered (when given): through the template's own
/// `tools` variable when it reads one, otherwise as text in the system message (added, or
/// appended to the conversation's own).
pub fn render(
    tmpl: &crate::chat::ChatTemplate,
    messages: &[crate::chat::Message],
    tools: Option<&Tools>,
    enable_thinking: Option<bool>,
) -> Result<String> {
    let Some(t) = tools else {
        return tmpl.render_with(messages, true, enable_thinking, None);
    };
    if tmpl.reads("tools") {
        return tmpl.render_with(messages, true, enable_thinking, Some(&t.specs));
    }
    let mut msgs = messages.to_vec();
    match msgs.first_mut() {
        Some(m) if m.role == "system" => {
            m.content = format!("{}\n\n{}", m.content, t.system_text());
        }
        _ => msgs.insert(0, crate::chat::Message::new("system", &t.system_text())),
    }
    tmpl.render_with(&msgs, true, enable_thinking, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
        "description": "Weather for a city", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"name": "now"}]"#;

    #[test]
    fn specs_are_normalised_and_checked() {
        let t = Tools::parse(SPECS).unwrap();
        assert_eq!(t.specs.len(), 2);
        assert_eq!(t.specs[1]["function"]["parameters"]["type"], "object");
        assert_eq!(t.specs[1]["type"], "function");
        for (bad_specs, says) in [
            ("[]", "empty"),
            ("[{\"description\": \"x\"}]", "no \"name\""),
            ("[{\"name\": \"a\"}, {\"name\": \"a\"}]", "two tools"),
            (
                "[{\"name\": \"a\", \"parameters\": 3}]",
                "not a JSON schema",
            ),
            ("nope", "not JSON"),
        ] {
            let e = Tools::parse(bad_specs).unwrap_err().to_string();
            assert!(e.contains(says), "{bad_specs}: {e}");
        }
    }

    #[test]
    fn calls_are_parsed_from_blocks_naming_known_tools() {
        let t = Tools::parse(SPECS).unwrap();
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\
                    <tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call><tool_call>{oops</tool_call>";
        assert_eq!(
            t.parse_calls(text),
            vec![ToolCall {
                kind: "function",
                function: Function {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                }
            }]
        );
        assert!(t.parse_calls("no calls here").is_empty());
    }
}
