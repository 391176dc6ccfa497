//! Chat templates: render a bundle's Jinja chat template the way HF
//! `apply_chat_template(messages, add_generation_prompt=True)` does, with minijinja.
//!
//! HF renders with `trim_blocks` and `lstrip_blocks`, exposes `raise_exception`, `tojson`,
//! loop controls, `namespace` and Python string methods (through minijinja-contrib's
//! pycompat callback), and tokenizes the result with `add_special_tokens=False`: a template
//! that wants BOS writes `{{ bos_token }}` itself.

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A loaded chat template with the special-token strings it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    pub source: String,
    /// Where the template came from (manifest, tokenizer_config.json, chat_template.jinja).
    pub origin: PathBuf,
    pub bos_token: String,
    pub eos_token: String,
}

fn terr(path: &Path, msg: impl Into<String>) -> Error {
    Error::File {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// A special token in tokenizer_config.json is a string or an AddedToken object.
fn token_str(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        o => o.get("content")?.as_str().map(str::to_string),
    }
}

/// The bundle's own BOS / EOS ids, the fallbacks for the template's token strings.
#[derive(Debug, Clone, Copy, Default)]
pub struct BundleIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
}

impl ChatTemplate {
    /// The template from the bundle's own description (`given`, with where it came from),
    /// else the tokenizer's `tokenizer_config.json`, else `chat_template.jinja` beside the
    /// tokenizer. `bundle` names the bundle file in errors; `genie` says it is a Genie
    /// config (which carries no template of its own, so the error says where else qhx looked).
    pub fn from_sources(
        given: Option<(String, std::path::PathBuf)>,
        bundle: &Path,
        genie: bool,
        tokenizer: &Path,
        ids: BundleIds,
        tok: Option<&Tokenizer>,
    ) -> Result<ChatTemplate> {
        let dir = tokenizer.parent().unwrap_or(Path::new("."));
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Option<serde_json::Value> = match std::fs::read(&cfg_path) {
            Ok(b) => Some(
                serde_json::from_slice(&b)
                    .map_err(|e| terr(&cfg_path, format!("not JSON: {e}")))?,
            ),
            Err(_) => None,
        };
        let from_cfg = || {
            let c = cfg.as_ref()?;
            match c.get("chat_template")? {
                serde_json::Value::String(s) => Some(s.clone()),
                // A list of named templates: take "default".
                serde_json::Value::Array(a) => a
                    .iter()
                    .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                _ => None,
            }
            .map(|t| (t, cfg_path.clone()))
        };
        let jinja_path = dir.join("chat_template.jinja");
        let from_file = || {
            std::fs::read_to_string(&jinja_path)
                .ok()
                .map(|t| (t, jinja_path.clone()))
        };
        let (source, origin) = given
            .or_else(from_cfg)
            .or_else(from_file)
            .ok_or_else(|| Error::Manifest {
                path: bundle.to_path_buf(),
                msg: if genie {
                    format!(
                        "the Genie bundle has no chat template (Genie configs carry none; qhx looks for chat_template in {} and for {})",
                        cfg_path.display(),
                        jinja_path.display()
                    )
                } else {
                    format!(
                        "the bundle has no chat template (no chat.template, no chat_template in {}, no {})",
                        cfg_path.display(),
                        jinja_path.display()
                    )
                },
            })?;
        let piece = |id: Option<u32>| {
            id.and_then(|i| tok.map(|t| t.token_to_piece(i)))
                .unwrap_or_default()
        };
        let bos_token = cfg
            .as_ref()
            .and_then(|c| token_str(c.get("bos_token")))
            .unwrap_or_else(|| piece(ids.bos));
        let eos_token = cfg
            .as_ref()
            .and_then(|c| token_str(c.get("eos_token")))
            .unwrap_or_else(|| piece(ids.eos));
        Ok(ChatTemplate {
            source,
            origin,
            bos_token,
            eos_token,
        })
    }

    /// Render `messages` as HF `apply_chat_template(..., tokenize=False)` does.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, None, None)
    }

    /// Whether the template reads a variable (e.g. `tools`).
    pub fn reads(&self, var: &str) -> bool {
        self.source.contains(var)
    }

    /// [`ChatTemplate::render`] with `enable_thinking` and `tools` set for the template (as
    /// HF passes extra keyword arguments), when given; templates that do not read them
    /// ignore them.
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |fmt: String| -> String {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            strftime(&fmt, now)
        });
        let err = |e: minijinja::Error| {
            let mut msg = format!("chat template: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            terr(&self.origin, msg)
        };
        env.add_template("chat", &self.source).map_err(err)?;
        let t = env.get_template("chat").map_err(err)?;
        let base = minijinja::context! {
            messages => messages,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            add_generation_prompt => add_generation_prompt,
        };
        let ctx = match enable_thinking {
            Some(on) => minijinja::context! { enable_thinking => on, ..base },
            None => base,
        };
        let ctx = match tools {
            Some(t) => minijinja::context! { tools => t, ..ctx },
            None => ctx,
        };
        t.render(ctx).map_err(err)
    }

    /// Render and tokenize (no special tokens added: the template carries them).
    pub fn encode(
        &self,
        tok: &Tokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        let text = self.render(messages, add_generation_prompt)?;
        tok.encode_raw(&text)
    }
}

/// `strftime` over UTC seconds since the epoch, for the codes chat templates use (%Y %m %d
/// %e %b %B %a %A %H %M %S %y %j %%); others are kept verbatim.
pub fn strftime(fmt: &str, secs: u64) -> String {
    const MON: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAY: [&str; 7] = [
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
    ];
    let days = (secs / 86_400) as i64;
    let tod = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let jday = CUM[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wd = DAY[days.rem_euclid(7) as usize];
    let mn = MON[(m - 1) as usize];
    let mut out = String::new();
    let mut it = fmt.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:2}")),
            Some('j') => out.push_str(&format!("{jday:03}")),
            Some('b') => out.push_str(&mn[..3]),
            Some('B') => out.push_str(mn),
            Some('a') => out.push_str(&wd[..3]),
            Some('A') => out.push_str(wd),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Build the message list of a one-shot `--chat` run.
pub fn conversation(system: Option<&str>, user: &str) -> Vec<Message> {
    let mut v = Vec::new();
    if let Some(s) = system {
        v.push(Message::new("system", s));
    }
    v.push(Message::new("user", user));
    v
}

/// Read a conversation file: a JSON array of `{"role", "content"}` objects.
pub fn load_messages(path: &Path) -> Result<Vec<Message>> {
    let b = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&b).map_err(|e| {
        terr(
            path,
            format!("expected a JSON array of {{\"role\", \"content\"}} objects: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn strftime_known_instants() {
        use super::strftime;
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %a", 0),
            "1970-01-01 00:00:00 Thu"
        );
        // 2000-02-29 12:34:56 UTC, a leap day (Tuesday), day 060 of the year.
        assert_eq!(
            strftime("%d %b %Y %A %j %y %e%%", 951_827_696),
            "29 Feb 2000 Tuesday 060 00 29%"
        );
        assert_eq!(strftime("%B %q", 1_764_633_600), "December %q"); // 2025-12-02
    }
}
