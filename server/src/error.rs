//! Errors as OpenAI's API returns them: a status and
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// One failed request, ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, `server_error`, …
    pub kind: &'static str,
    /// The request field at fault (`messages[2].content`), when one is.
    pub param: Option<String>,
    /// A short machine-readable code (`unsupported_parameter`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
    /// Seconds a client should wait before retrying (503 when the queue is full).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 without a field to blame (the body as a whole).
    pub fn bad_body(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400: a field this server does not implement (never silently ignored).
    pub fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid(param, message)
        }
    }

    pub fn with_code(self, code: &'static str) -> ApiError {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key (send `Authorization: Bearer <key>`)",
            )
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this method is not allowed on this path",
        )
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds {limit} bytes (--max-body)"),
        )
    }

    /// 503 with `Retry-After`: every session is busy and the queue is full.
    pub fn overloaded(queue: usize) -> ApiError {
        ApiError {
            retry_after: Some(1),
            code: Some("server_overloaded"),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the server is busy: every session is in use and {queue} requests are waiting (--queue); retry later"),
            )
        }
    }

    pub fn shutting_down() -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is shutting down",
            )
        }
    }

    /// 500: the runtime failed (the message says how; the server goes on).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// A runtime error of one request, as the client sees it: what it asked for that cannot be
/// done is 400, the rest is 500.
pub fn from_runtime(e: &qhx::Error) -> ApiError {
    use qhx::Error as E;
    match e {
        E::NoRoom { .. } | E::PromptTooLong { .. } => {
            ApiError::invalid("messages", e.to_string()).with_code("context_length_exceeded")
        }
        E::EmptyPrompt => ApiError::invalid("messages", e.to_string()),
        E::Grammar(m) => ApiError::invalid("response_format", m.clone()),
        _ => ApiError::internal(e.to_string()),
    }
}
