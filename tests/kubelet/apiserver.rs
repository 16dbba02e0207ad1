//! A fake Kubernetes API server for the node condition (`--kubernetes-node-condition`): one Node
//! whose status takes strategic merge patches of its conditions, and events.k8s.io/v1 Events,
//! over TLS with a bearer token. It refuses what the real API server refuses for these calls
//! (the path and verb, the content type, the body's shape, an Event's required fields and
//! limits, as `ValidateEventCreate`), merges a patched condition into the node's by `type` as
//! the strategic merge does, and keeps every request so that a test can read exactly what it was
//! sent. A test can make it answer with an error status, or slowly.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::https::{Chunks, TlsServer};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub content_type: String,
    pub body: Value,
}

struct State {
    node: String,
    token: String,
    /// The node's `status.conditions`.
    conditions: Vec<Value>,
    /// The Events created, with their generated names.
    events: Vec<Value>,
    /// Every request that passed authentication, in order.
    requests: Vec<Request>,
    /// Answer every request with this status and message instead.
    failure: Option<(u16, String)>,
    /// Answer every request with this status and a body of this many bytes instead.
    huge_failure: Option<(u16, usize)>,
    delay: Duration,
}

/// A running fake API server. Stops on drop.
pub struct FakeApiServer {
    server: TlsServer,
    state: Arc<Mutex<State>>,
}

impl FakeApiServer {
    /// Serves the Node `node` (with a `Ready` condition) to requests carrying `Bearer <token>`.
    pub fn start(node: &str, token: &str) -> FakeApiServer {
        let ready = json!({
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-11-28T00:00:00Z", "lastTransitionTime": "2026-11-27T00:00:00Z",
        });
        let state = Arc::new(Mutex::new(State {
            node: node.to_owned(),
            token: token.to_owned(),
            conditions: vec![ready],
            events: Vec::new(),
            requests: Vec::new(),
            failure: None,
            huge_failure: None,
            delay: Duration::ZERO,
        }));
        let s = state.clone();
        let server = TlsServer::start(
            "fake API server CA",
            || true,
            move |req| answer(req, s.clone()),
        );
        FakeApiServer { server, state }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn ca_pem(&self) -> &str {
        &self.server.ca.pem
    }

    /// The node's conditions now.
    pub fn conditions(&self) -> Vec<Value> {
        self.state.lock().unwrap().conditions.clone()
    }

    /// The condition of `kind` now, if any.
    pub fn condition(&self, kind: &str) -> Option<Value> {
        self.conditions().into_iter().find(|c| c["type"] == kind)
    }

    /// The Events created so far.
    pub fn events(&self) -> Vec<Value> {
        self.state.lock().unwrap().events.clone()
    }

    /// Every authenticated request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Answers later requests with `status` and `message` (a `Status` object), or normally.
    pub fn set_failure(&self, failure: Option<(u16, &str)>) {
        self.state.lock().unwrap().failure = failure.map(|(c, m)| (c, m.to_owned()));
    }

    /// Makes later requests fail with `code` and a body of `bytes` bytes that declares no
    /// length (or stops doing so, with `None`).
    pub fn set_huge_failure(&self, failure: Option<(u16, usize)>) {
        self.state.lock().unwrap().huge_failure = failure;
    }

    /// Makes later requests wait `delay` before answering.
    pub fn set_delay(&self, delay: Duration) {
        self.state.lock().unwrap().delay = delay;
    }
}

/// A `Status` answer, as the API server sends with an error.
fn status(code: u16, message: &str) -> http::Response<String> {
    let reason = match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        _ => "InternalError",
    };
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(body.to_string())
        .unwrap()
}

fn ok(code: u16, body: Value) -> http::Response<String> {
    http::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(body.to_string())
        .unwrap()
}

async fn answer(
    req: http::Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> http::Response<Chunks> {
    let huge = state.lock().unwrap().huge_failure;
    if let Some((code, bytes)) = huge {
        return http::Response::builder()
            .status(code)
            .body(Chunks::repeated(bytes))
            .unwrap();
    }
    answer_small(req, state)
        .await
        .map(|body| Chunks::one(body.into_bytes()))
}

async fn answer_small(
    req: http::Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> http::Response<String> {
    let (parts, body) = req.into_parts();
    let header = |name: http::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (token, delay, failure) = {
        let s = state.lock().unwrap();
        (s.token.clone(), s.delay, s.failure.clone())
    };
    tokio::time::sleep(delay).await;
    if header(http::header::AUTHORIZATION) != format!("Bearer {token}") {
        return status(401, "Unauthorized");
    }
    let Ok(bytes) = axum::body::to_bytes(axum::body::Body::new(body), 3 * 1024 * 1024).await else {
        return status(400, "the request body could not be read");
    };
    let Ok(body) = serde_json::from_slice::<Value>(&bytes) else {
        return status(400, "the request body is not JSON");
    };
    let request = Request {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        content_type: header(http::header::CONTENT_TYPE),
        body,
    };
    let mut s = state.lock().unwrap();
    s.requests.push(request.clone());
    if let Some((code, message)) = failure {
        return status(code, &message);
    }
    let status_path = format!("/api/v1/nodes/{}/status", s.node);
    match (request.method.as_str(), request.path.as_str()) {
        ("PATCH", path) if path == status_path => patch_status(&mut s, &request),
        ("POST", path) if path.starts_with("/apis/events.k8s.io/v1/namespaces/") => {
            create_event(&mut s, &request)
        }
        ("PATCH", path) if path.starts_with("/api/v1/nodes/") => {
            status(404, &format!("nodes {path:?} not found"))
        }
        _ => status(404, "the server could not find the requested resource"),
    }
}

/// A strategic merge patch of `status.conditions`: merged by `type` into the node's.
fn patch_status(s: &mut State, request: &Request) -> http::Response<String> {
    if request.content_type != "application/strategic-merge-patch+json" {
        // A JSON merge patch would replace the whole list, dropping the kubelet's conditions.
        return status(
            415,
            &format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {:?})",
                request.content_type
            ),
        );
    }
    let body = &request.body;
    let only = |v: &Value, key: &str| {
        v.as_object()
            .is_some_and(|o| o.len() == 1 && o.contains_key(key))
    };
    if !only(body, "status") || !only(&body["status"], "conditions") {
        return status(
            422,
            &format!("the patch changes more than status.conditions: {body}"),
        );
    }
    let Some(patched) = body["status"]["conditions"].as_array() else {
        return status(422, "status.conditions is not a list");
    };
    for condition in patched {
        if let Err(e) = valid_condition(condition) {
            return status(422, &format!("status.conditions: {e}: {condition}"));
        }
        match s
            .conditions
            .iter_mut()
            .find(|c| c["type"] == condition["type"])
        {
            Some(existing) => {
                for (k, v) in condition.as_object().unwrap() {
                    existing[k] = v.clone();
                }
            }
            None => s.conditions.push(condition.clone()),
        }
    }
    ok(
        200,
        json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": s.node},
               "status": {"conditions": s.conditions}}),
    )
}

fn valid_condition(c: &Value) -> Result<(), String> {
    let text = |k: &str| c[k].as_str().ok_or_else(|| format!("{k} missing"));
    if text("type")?.is_empty() {
        return Err("an empty type".into());
    }
    if !["True", "False", "Unknown"].contains(&text("status")?) {
        return Err("status is not True, False or Unknown".into());
    }
    for k in ["lastHeartbeatTime", "lastTransitionTime"] {
        let t = text(k)?;
        // metav1.Time: RFC 3339 in whole seconds, UTC.
        if t.len() != 20 || !t.ends_with('Z') || humantime::parse_rfc3339(t).is_err() {
            return Err(format!("{k} {t:?} is not RFC 3339 in seconds"));
        }
    }
    text("reason")?;
    text("message")?;
    Ok(())
}

/// An events.k8s.io/v1 Event, validated as `ValidateEventCreate` does for one with `eventTime`.
fn create_event(s: &mut State, request: &Request) -> http::Response<String> {
    if request.content_type != "application/json" {
        return status(415, "the body of the request was in an unknown format");
    }
    let e = &request.body;
    let namespace = request
        .path
        .trim_start_matches("/apis/events.k8s.io/v1/namespaces/")
        .trim_end_matches("/events");
    let problems = event_problems(e, namespace);
    if !problems.is_empty() {
        return status(422, &format!("Event is invalid: {}", problems.join("; ")));
    }
    let mut created = e.clone();
    let name = match e["metadata"]["name"].as_str() {
        Some(name) => name.to_owned(),
        None => format!(
            "{}{:05}",
            e["metadata"]["generateName"].as_str().unwrap(),
            s.events.len()
        ),
    };
    created["metadata"]["name"] = json!(name);
    s.events.push(created.clone());
    ok(201, created)
}

fn event_problems(e: &Value, namespace: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: &str| {
        if !ok {
            problems.push(what.to_owned());
        }
    };
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    check(
        e["apiVersion"] == "events.k8s.io/v1" && e["kind"] == "Event",
        "apiVersion/kind",
    );
    let meta = &e["metadata"];
    check(
        meta["name"].is_string() || meta["generateName"].is_string(),
        "metadata.name: Required value: name or generateName is required",
    );
    check(
        meta["namespace"].is_null() || meta["namespace"] == namespace,
        "metadata.namespace: does not match the namespace of the request",
    );
    check(
        humantime::parse_rfc3339(&text(&e["eventTime"])).is_ok(),
        "eventTime: Required value",
    );
    let regarding = &e["regarding"];
    check(
        regarding["namespace"].is_string() || ["default", "kube-system"].contains(&namespace),
        "regarding.namespace: does not match event.namespace",
    );
    check(regarding["kind"] == "Node", "regarding.kind: the Node");
    let controller = text(&e["reportingController"]);
    check(
        !controller.is_empty()
            && controller.len() <= 63
            && controller
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
        "reportingController: a qualified name",
    );
    for (field, limit) in [("reportingInstance", 128), ("action", 128), ("reason", 128)] {
        let v = text(&e[field]);
        check(!v.is_empty(), &format!("{field}: Required value"));
        check(
            v.len() <= limit,
            &format!("{field}: can have at most {limit} characters"),
        );
    }
    check(
        text(&e["note"]).len() <= 1024,
        "note: can have at most 1024 characters",
    );
    check(
        ["Normal", "Warning"].contains(&text(&e["type"]).as_str()),
        "type: Unsupported value",
    );
    problems
}
