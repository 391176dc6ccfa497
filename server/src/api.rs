//! Request bodies of `/v1/chat/completions` and `/v1/completions`, read into what a
//! [`qhx::session::Session`] runs. Every field is checked here, before a request queues:
//! a wrong type or range, an unknown field, or one this server does not implement (`n` > 1,
//! `logprobs`, …) is a 400 naming the field, never silently ignored.

use crate::error::ApiError;
use qhx::chat::Message;
use qhx::grammar;
use qhx::session::{Chat, Prompt};
use qhx::tools::Tools;
use serde_json::{Map, Value};

/// Settings a request inherits when it does not give them (the server's command line).
#[derive(Debug, Clone)]
pub struct Defaults {
    pub sampler: qhx::sampler::SamplerConfig,
    /// `max_tokens` of a completion that gives none (chat: until the context is full).
    pub completion_max_tokens: usize,
    /// Speculative decoding for every request (`--spec`).
    pub spec: Option<qhx::speculative::SpecConfig>,
}

/// How a reply may use the tools offered.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// A tool call or plain text.
    Auto,
    /// A tool call (of the one named tool, when `Tools` was narrowed to it).
    Required,
}

/// A request, checked, as the pool runs it.
#[derive(Debug, Clone)]
pub struct Work {
    pub prompt: Prompt,
    /// None: as many as the context leaves.
    pub max_tokens: Option<usize>,
    pub sampler: qhx::sampler::SamplerConfig,
    pub stops: Vec<String>,
    pub grammar: Option<grammar::Spec>,
    /// Tools offered, and how (the reply is parsed for calls).
    pub tools: Option<(Tools, ToolChoice)>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage`.
    pub include_usage: bool,
    /// The `model` the client named (echoed back).
    pub model: Option<String>,
    /// Generate past the end token (llama-server's `ignore_eos`, for benchmarks).
    pub ignore_eos: bool,
    /// Reuse the prefix a session's cache shares with the prompt (llama-server's
    /// `cache_prompt`, default true; false feeds the whole prompt, as a fresh run).
    pub cache_prompt: bool,
    pub spec: Option<qhx::speculative::SpecConfig>,
}

/// Which endpoint a body came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// Fields read by both endpoints.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    // llama-server's extensions, with its names
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "ignore_eos",
    "cache_prompt",
];
const CHAT_ONLY: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "top_logprobs",
    "store",
    "metadata",
];
const COMPLETION_ONLY: &[&str] = &["prompt", "echo", "suffix", "best_of"];

/// Read a body (raw bytes) sent to `ep`.
pub fn parse(ep: Endpoint, body: &[u8], d: &Defaults) -> Result<Work, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::bad_body(format!(
            "the body is not valid UTF-8 (byte {})",
            e.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::bad_body(
            "the body is empty; expected a JSON object",
        ));
    }
    let v: Value = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_body(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = v else {
        return Err(ApiError::bad_body(format!(
            "the body is JSON {}, expected an object",
            kind(&v)
        )));
    };
    let own = match ep {
        Endpoint::Chat => CHAT_ONLY,
        Endpoint::Completions => COMPLETION_ONLY,
    };
    if let Some(k) = o
        .keys()
        .find(|k| !COMMON.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        return Err(ApiError::unsupported(
            k,
            format!("unknown or unsupported field `{k}`"),
        ));
    }
    let f = Fields(&o);
    f.unsupported_unless("n", |v| v.as_u64() == Some(1), "only n = 1 is supported")?;
    f.unsupported_unless(
        "logprobs",
        |v| v == &Value::Bool(false) || v.is_null(),
        "logprobs are not supported",
    )?;
    f.unsupported_unless("top_logprobs", Value::is_null, "logprobs are not supported")?;
    for p in ["presence_penalty", "frequency_penalty"] {
        f.unsupported_unless(
            p,
            |v| v.as_f64() == Some(0.0),
            "only 0 is supported (repeat_penalty is this server's penalty)",
        )?;
    }
    f.unsupported_unless(
        "logit_bias",
        |v| v.is_null() || v.as_object().is_some_and(Map::is_empty),
        "logit_bias is not supported",
    )?;
    f.unsupported_unless(
        "store",
        |v| v == &Value::Bool(false),
        "this server stores nothing",
    )?;
    f.unsupported_unless(
        "echo",
        |v| v == &Value::Bool(false),
        "echo is not supported",
    )?;
    f.unsupported_unless(
        "suffix",
        Value::is_null,
        "suffix (fill-in-the-middle) is not supported",
    )?;
    f.unsupported_unless(
        "best_of",
        |v| v.as_u64() == Some(1),
        "only best_of = 1 is supported",
    )?;
    f.string_opt("user")?;
    if let Some(m) = o.get("metadata") {
        if !m.is_object() && !m.is_null() {
            return Err(ApiError::invalid(
                "metadata",
                "`metadata` must be an object",
            ));
        }
    }
    f.bool_opt("parallel_tool_calls")?;

    let mut sampler = d.sampler.clone();
    if let Some(t) = f.number("temperature", 0.0, 2.0)? {
        sampler.temp = t as f32;
    }
    if let Some(p) = f.number("top_p", 0.0, 1.0)? {
        if p <= 0.0 {
            return Err(ApiError::invalid("top_p", "`top_p` must be in (0, 1]"));
        }
        sampler.top_p = p as f32;
    }
    if let Some(p) = f.number("min_p", 0.0, 0.999_999)? {
        sampler.min_p = p as f32;
    }
    if let Some(k) = f.uint("top_k", 0, u32::MAX as u64)? {
        sampler.top_k = k as usize;
    }
    if let Some(p) = f.number("repeat_penalty", 1e-6, 100.0)? {
        sampler.repeat_penalty = p as f32;
    }
    if let Some(n) = f.uint("repeat_last_n", 0, u32::MAX as u64)? {
        sampler.repeat_last_n = n as usize;
    }
    if let Some(s) = f.seed()? {
        sampler.seed = Some(s);
    } else if d.sampler.seed.is_none() {
        sampler.seed = Some(rand_seed());
    }
    let max_tokens = match (
        f.uint("max_tokens", 1, u32::MAX as u64)?,
        f.uint("max_completion_tokens", 1, u32::MAX as u64)?,
    ) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "max_completion_tokens",
                "give `max_tokens` or `max_completion_tokens`, not both",
            ))
        }
        (a, b) => a.or(b).map(|n| n as usize),
    };
    let stream = f.bool_opt("stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => {
            if !stream {
                return Err(ApiError::invalid(
                    "stream_options",
                    "`stream_options` is only allowed with `stream: true`",
                ));
            }
            if let Some(k) = so.keys().find(|k| k.as_str() != "include_usage") {
                return Err(ApiError::unsupported(
                    &format!("stream_options.{k}"),
                    format!("unknown field `stream_options.{k}`"),
                ));
            }
            match so.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => return Err(type_error("stream_options.include_usage", "a boolean", v)),
            }
        }
        Some(v) => return Err(type_error("stream_options", "an object", v)),
    };
    let stops = stops(o.get("stop"))?;
    let model = f.string_opt("model")?;
    let ignore_eos = f.bool_opt("ignore_eos")?.unwrap_or(false);
    let cache_prompt = f.bool_opt("cache_prompt")?.unwrap_or(true);

    let (prompt, tools, grammar) = match ep {
        Endpoint::Chat => chat_prompt(&o)?,
        Endpoint::Completions => (completion_prompt(o.get("prompt"))?, None, None),
    };
    let max_tokens = match ep {
        Endpoint::Completions => Some(max_tokens.unwrap_or(d.completion_max_tokens)),
        Endpoint::Chat => max_tokens,
    };
    Ok(Work {
        prompt,
        max_tokens,
        sampler,
        stops,
        grammar,
        tools,
        stream,
        include_usage,
        model,
        ignore_eos,
        cache_prompt,
        spec: d.spec.clone(),
    })
}

fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // A random seed without a new dependency: the std hasher's per-process random keys
    // mixed with the time.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn type_error(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        param,
        format!("`{param}` must be {want}, not {}", kind(got)),
    )
}

/// Typed reads of top-level fields; null counts as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    fn unsupported_unless(
        &self,
        k: &str,
        ok: impl Fn(&Value) -> bool,
        why: &str,
    ) -> Result<(), ApiError> {
        match self.get(k) {
            Some(v) if !ok(v) => Err(ApiError::unsupported(k, format!("`{k}`: {why}"))),
            _ => Ok(()),
        }
    }

    fn number(&self, k: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let x = v.as_f64().ok_or_else(|| type_error(k, "a number", v))?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::invalid(
                k,
                format!("`{k}` is {x}; it must be in [{lo}, {hi}]"),
            ));
        }
        Ok(Some(x))
    }

    fn uint(&self, k: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(k) else {
            return Ok(None);
        };
        let x = match v {
            Value::Number(n) => n.as_u64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                    .map(|f| f as u64)
            }),
            _ => None,
        };
        let x = x.ok_or_else(|| match v {
            Value::Number(_) => {
                ApiError::invalid(k, format!("`{k}` must be a whole number ≥ {lo}, not {v}"))
            }
            _ => type_error(k, "an integer", v),
        })?;
        if !(lo..=hi).contains(&x) {
            return Err(ApiError::invalid(
                k,
                format!("`{k}` is {x}; it must be in [{lo}, {hi}]"),
            ));
        }
        Ok(Some(x))
    }

    /// OpenAI seeds are any 64-bit integer; negative ones are taken as their bits.
    fn seed(&self) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get("seed") else {
            return Ok(None);
        };
        match v.as_u64().or_else(|| v.as_i64().map(|i| i as u64)) {
            Some(s) => Ok(Some(s)),
            None => Err(type_error("seed", "an integer", v)),
        }
    }

    fn bool_opt(&self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(type_error(k, "a boolean", v)),
        }
    }

    fn string_opt(&self, k: &str) -> Result<Option<String>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(type_error(k, "a string", v)),
        }
    }
}

/// `stop`: a string or an array of up to 4 non-empty strings.
fn stops(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| type_error(&format!("stop[{i}]"), "a string", s))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(type_error("stop", "a string or an array of strings", v)),
    };
    if list.len() > 4 {
        return Err(ApiError::invalid(
            "stop",
            format!("`stop` has {} strings; at most 4 are allowed", list.len()),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    Ok(list)
}

/// `prompt` of `/v1/completions`: a string, a one-string array, or an array of token ids.
fn completion_prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    match v {
        None | Some(Value::Null) => Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            let ids: Option<Vec<u32>> = a
                .iter()
                .map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()))
                .collect();
            ids.map(Prompt::Ids)
                .ok_or_else(|| ApiError::invalid("prompt", "a token id is out of range"))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) && a.len() > 1 => {
            Err(ApiError::unsupported(
                "prompt",
                "a batch of prompts is not supported (one per request)",
            ))
        }
        Some(v) => Err(type_error("prompt", "a string or an array of token ids", v)),
    }
}

type ChatParts = (Prompt, Option<(Tools, ToolChoice)>, Option<grammar::Spec>);

fn chat_prompt(o: &Map<String, Value>) -> Result<ChatParts, ApiError> {
    let messages = match o.get("messages") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid("messages", "`messages` is required"))
        }
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid("messages", "`messages` is empty"))
        }
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(type_error("messages", "an array", v)),
    };
    let tools = match o.get("tools") {
        None | Some(Value::Null) => None,
        Some(v @ Value::Array(_)) => {
            for (i, t) in v.as_array().into_iter().flatten().enumerate() {
                if let Some(ty) = t.get("type") {
                    if ty != "function" {
                        return Err(ApiError::unsupported(
                            &format!("tools[{i}].type"),
                            format!("tool type {ty} is not supported (only \"function\")"),
                        ));
                    }
                }
            }
            Some(
                Tools::parse(&v.to_string())
                    .map_err(|e| ApiError::invalid("tools", e.to_string()))?,
            )
        }
        Some(v) => return Err(type_error("tools", "an array", v)),
    };
    let tools = match (tools, o.get("tool_choice")) {
        (t, None | Some(Value::Null)) => t.map(|t| (t, ToolChoice::Auto)),
        (None, Some(_)) => {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` needs `tools`",
            ))
        }
        (Some(t), Some(Value::String(s))) => match s.as_str() {
            "auto" => Some((t, ToolChoice::Auto)),
            "required" => Some((t, ToolChoice::Required)),
            // The tools are not offered at all: the reply is plain text.
            "none" => None,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` {other:?} is not one of \"none\", \"auto\", \"required\" or a function"),
                ))
            }
        },
        (Some(t), Some(Value::Object(c))) => {
            let name = c
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "`tool_choice` must be {\"type\": \"function\", \"function\": {\"name\": …}}",
                    )
                })?;
            let one: Vec<Value> = t
                .specs
                .iter()
                .filter(|s| s["function"]["name"] == name)
                .cloned()
                .collect();
            if one.is_empty() {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` names {name:?}, which is not in `tools`"),
                ));
            }
            Some((Tools { specs: one }, ToolChoice::Required))
        }
        (Some(_), Some(v)) => return Err(type_error("tool_choice", "a string or an object", v)),
    };
    let grammar = response_format(o.get("response_format"))?;
    if grammar.is_some() && tools.is_some() {
        return Err(ApiError::unsupported(
            "response_format",
            "`response_format` together with `tools` is not supported",
        ));
    }
    let grammar = match &tools {
        Some((t, choice)) => Some(t.grammar(*choice == ToolChoice::Required)),
        None => grammar,
    };
    let prompt = Prompt::Chat(Chat {
        messages,
        tools: tools.as_ref().map(|(t, _)| t.clone()),
        no_thinking: false,
    });
    Ok((prompt, tools, grammar))
}

/// `response_format`: text, any JSON object, or a JSON schema.
fn response_format(v: Option<&Value>) -> Result<Option<grammar::Spec>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(o) = v.as_object() else {
        return Err(type_error("response_format", "an object", v));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(grammar::Spec::JsonSchema(
            serde_json::json!({"type": "object"}),
        ))),
        Some("json_schema") => {
            let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema",
                    "`response_format.json_schema` must be an object with `name` and `schema`",
                )
            })?;
            if let Some(k) = js
                .keys()
                .find(|k| !["name", "schema", "strict", "description"].contains(&k.as_str()))
            {
                return Err(ApiError::unsupported(
                    &format!("response_format.json_schema.{k}"),
                    format!("unknown field `response_format.json_schema.{k}`"),
                ));
            }
            match js.get("name") {
                Some(Value::String(n)) if !n.is_empty() => {}
                _ => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.name",
                        "`response_format.json_schema.name` must be a non-empty string",
                    ))
                }
            }
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Ok(Some(grammar::Spec::JsonSchema(s.clone()))),
                Some(Value::Bool(true)) | None => Ok(Some(grammar::Spec::JsonSchema(
                    serde_json::json!({}),
                ))),
                Some(v) => Err(type_error("response_format.json_schema.schema", "an object", v)),
            }
        }
        Some(t) => Err(ApiError::invalid(
            "response_format.type",
            format!("`response_format.type` {t:?} is not one of \"text\", \"json_object\", \"json_schema\""),
        )),
        None => Err(ApiError::invalid(
            "response_format.type",
            "`response_format.type` is required",
        )),
    }
}

/// One message: its role and its text (text parts joined; an assistant's tool calls in the
/// tool-call syntax the model was taught).
fn message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = |k: &str| format!("messages[{i}].{k}");
    let Some(o) = m.as_object() else {
        return Err(type_error(&format!("messages[{i}]"), "an object", m));
    };
    if let Some(k) = o.keys().find(|k| {
        ![
            "role",
            "content",
            "name",
            "tool_calls",
            "tool_call_id",
            "refusal",
        ]
        .contains(&k.as_str())
    }) {
        return Err(ApiError::unsupported(
            &at(k),
            format!("unknown field `{}`", at(k)),
        ));
    }
    let role = match o.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(v) => return Err(type_error(&at("role"), "a string", v)),
        None => {
            return Err(ApiError::invalid(
                at("role"),
                format!("`{}` is required", at("role")),
            ))
        }
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        // OpenAI's newer name for the system role.
        "developer" => "system",
        r => {
            return Err(ApiError::invalid(
                at("role"),
                format!(
                    "`{}` {r:?} is not one of system, developer, user, assistant, tool",
                    at("role")
                ),
            ))
        }
    };
    let mut content = match o.get("content") {
        None | Some(Value::Null) => {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    at("content"),
                    format!("`{}` is required for a {role} message", at("content")),
                ));
            }
            String::new()
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut s = String::new();
            for (j, p) in parts.iter().enumerate() {
                let here = format!("messages[{i}].content[{j}]");
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => match p.get("text") {
                        Some(Value::String(t)) => s.push_str(t),
                        Some(v) => return Err(type_error(&format!("{here}.text"), "a string", v)),
                        None => {
                            return Err(ApiError::invalid(
                                format!("{here}.text"),
                                format!("`{here}.text` is required"),
                            ))
                        }
                    },
                    Some(t) => {
                        return Err(ApiError::unsupported(
                            &format!("{here}.type"),
                            format!("content part type {t:?} is not supported (text only)"),
                        ))
                    }
                    None => {
                        return Err(ApiError::invalid(
                            format!("{here}.type"),
                            format!("`{here}.type` is required"),
                        ))
                    }
                }
            }
            s
        }
        Some(v) => {
            return Err(type_error(
                &at("content"),
                "a string or an array of parts",
                v,
            ))
        }
    };
    match o.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) if role == "assistant" => {
            for (j, c) in calls.iter().enumerate() {
                let f = c.get("function");
                let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                let args = f.and_then(|f| f.get("arguments")).and_then(Value::as_str);
                let (Some(name), Some(args)) = (name, args) else {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].tool_calls[{j}]"),
                        "a tool call needs `function.name` and `function.arguments` (a JSON string)",
                    ));
                };
                let args: Value = serde_json::from_str(args).map_err(|e| {
                    ApiError::invalid(
                        format!("messages[{i}].tool_calls[{j}].function.arguments"),
                        format!("the arguments are not JSON: {e}"),
                    )
                })?;
                if !content.is_empty() {
                    content.push('\n');
                }
                // The layout the tool-call grammar makes the model write.
                content.push_str(&format!(
                    "{}\n{{\"name\": {}, \"arguments\": {args}}}\n{}",
                    qhx::tools::OPEN,
                    Value::String(name.to_string()),
                    qhx::tools::CLOSE
                ));
            }
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                at("tool_calls"),
                "only an assistant message has `tool_calls`",
            ))
        }
        Some(v) => return Err(type_error(&at("tool_calls"), "an array", v)),
    }
    Ok(Message::new(role, &content))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Defaults {
        Defaults {
            sampler: Default::default(),
            completion_max_tokens: 16,
            spec: None,
        }
    }

    fn err(ep: Endpoint, body: &str) -> ApiError {
        parse(ep, body.as_bytes(), &defaults()).expect_err(body)
    }

    #[test]
    fn a_plain_chat_request_reads_its_messages_and_settings() {
        let w = parse(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":" there"}]}],"max_tokens":5,"temperature":0,"seed":7,"stop":"\n"}"#,
            &defaults(),
        )
        .unwrap();
        let Prompt::Chat(c) = &w.prompt else {
            panic!("not a chat prompt")
        };
        assert_eq!(c.messages[0], Message::new("system", "Be brief."));
        assert_eq!(c.messages[1], Message::new("user", "Hi there"));
        assert_eq!(w.max_tokens, Some(5));
        assert_eq!(w.sampler.seed, Some(7));
        assert_eq!(w.stops, vec!["\n".to_string()]);
    }

    #[test]
    fn unsupported_fields_name_themselves() {
        let cases = [
            (r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#, "n"),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true}"#,
                "logprobs",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"wat":1}"#,
                "wat",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
                "temperature",
            ),
            (
                r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                "messages[0].content[0].type",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"}"#,
                "tool_choice",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#,
                "stream_options",
            ),
        ];
        for (body, param) in cases {
            let e = err(Endpoint::Chat, body);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e}");
            assert_eq!(e.status, 400);
        }
        assert_eq!(
            err(Endpoint::Completions, r#"{"prompt":"x","echo":true}"#)
                .param
                .as_deref(),
            Some("echo")
        );
    }

    #[test]
    fn a_named_tool_choice_narrows_the_tools_and_requires_a_call() {
        let w = parse(
            Endpoint::Chat,
            br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b"}}],"tool_choice":{"type":"function","function":{"name":"b"}}}"#,
            &defaults(),
        )
        .unwrap();
        let (t, choice) = w.tools.unwrap();
        assert_eq!(choice, ToolChoice::Required);
        assert_eq!(t.specs.len(), 1);
        assert_eq!(t.specs[0]["function"]["name"], "b");
        assert!(w.grammar.is_some());
    }

    #[test]
    fn an_assistant_tool_call_becomes_the_call_syntax_in_history() {
        let m = message(
            0,
            &serde_json::json!({"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]}),
        )
        .unwrap();
        assert_eq!(
            m.content,
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call>"
        );
    }
}
