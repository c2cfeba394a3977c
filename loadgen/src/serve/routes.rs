//! The HTTP side: paths, query parameters, lists, gets and watches (docs/wire.md).
//!
//! One handler routes by hand rather than through axum's router, so that every path works with
//! and without a trailing slash and everything unknown gets the real server's `Status` 404.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::watch;

use super::churn::ChurnSummary;
use super::faults::Faults;
use super::format::Format;
use super::limits::WatchProgress;
use super::objects::{self, Status};
use super::params;
use super::store::Store;
use super::watch::{WatchOptions, Watcher};
use super::writes::{self, media_type, FieldValidation, WriteRequest, MAX_BODY_BYTES};
use kcache_sim::apiserver::ContinueError;

/// What every request handler shares.
#[derive(Debug, Clone)]
pub struct App {
    /// The pods and their events.
    pub store: Arc<Store>,
    /// Where the server listens (for `/api`'s `serverAddressByClientCIDRs`).
    pub addr: SocketAddr,
    /// How often watches with `allowWatchBookmarks=true` get a bookmark.
    pub bookmark_interval: Duration,
    /// Turns true when the server stops; open watches end then.
    pub shutdown: watch::Receiver<bool>,
    /// The churn's summary once it is done.
    pub churn: watch::Receiver<Option<ChurnSummary>>,
    /// What is served (workload, sizes, rate, window), for `/loadgen/status`.
    pub label: String,
    /// Faults to inject, and their counts.
    pub faults: Arc<Faults>,
    /// How long a request for a resource version newer than the server's waits before its 504.
    pub too_large_wait: Duration,
    /// Whether pods can be written (`serve --writes`); without it every write is a 405.
    pub writes: bool,
}

/// Every request. Only a write's body is read.
pub async fn handle(State(app): State<App>, request: Request) -> Response {
    let (method, uri) = (request.method(), request.uri());
    let accept = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok());
    let errors = Format::for_errors(accept);
    if method != Method::GET && method != Method::HEAD {
        if !app.writes {
            return status_response_as(errors, &Status::method_not_allowed(method.as_str()));
        }
        if let Some(status) = app.faults.on_request(uri.query()) {
            return status_response_as(errors, &status);
        }
        return match write(&app, request).await {
            Ok(response) => response,
            Err(status) => close_after(status_response_as(errors, &status)),
        };
    }
    if let Some(status) = app.faults.on_request(uri.query()) {
        return status_response_as(errors, &status);
    }
    let progress = request.extensions().get::<Arc<WatchProgress>>();
    // A resource version newer than the server's: wait for it a while, as the API server
    // does, before the 504 (a client that outlived a restart gets its answer then).
    let wanted = params::newer_resource_version(uri.query(), app.store.resource_version());
    if let Some(wanted) = wanted {
        let deadline = tokio::time::Instant::now() + app.too_large_wait;
        while app.store.resource_version() < wanted && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(TOO_LARGE_POLL.min(app.too_large_wait)).await;
        }
        if app.store.resource_version() < wanted {
            super::faults::bump(&app.faults.counts.too_large_versions);
        }
    }
    match route(&app, uri, accept, progress) {
        Ok(response) => response,
        Err(status) => status_response_as(errors, &status),
    }
}

/// How often a request for a too-new version looks whether the server has reached it.
const TOO_LARGE_POLL: Duration = Duration::from_millis(50);

fn route(
    app: &App,
    uri: &Uri,
    accept: Option<&str>,
    progress: Option<&Arc<WatchProgress>>,
) -> Result<Response, Status> {
    let path = uri.path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let query = Query::parse(uri.query().unwrap_or(""));
    match segments.as_slice() {
        [] => Ok(json_response(&objects::root_paths())),
        ["version"] => Ok(json_response(&objects::version())),
        ["api"] => Ok(json_response(&objects::api_versions(app.addr))),
        ["apis"] => Ok(json_response(&objects::api_group_list())),
        ["api", "v1"] => Ok(json_response(&objects::api_resource_list(app.writes))),
        ["loadgen", "status"] => Ok(json_response(&status(app))),
        ["openapi", "v3"] => Ok(json_response(&objects::openapi_v3_root())),
        ["openapi", "v3", "api", "v1"] => Ok(json_response(&objects::openapi_v3_core())),
        ["api", "v1", "pods"] => {
            collection(app, None, &query, Format::negotiate(accept)?, progress)
        }
        ["api", "v1", "namespaces", ns, "pods"] if !ns.is_empty() => {
            collection(app, Some(ns), &query, Format::negotiate(accept)?, progress)
        }
        ["api", "v1", "namespaces", ns, "pods", name] if !ns.is_empty() && !name.is_empty() => {
            let format = Format::negotiate(accept)?;
            match app.store.get(ns, name) {
                Some(pod) => Ok(body_response(format, format.pod_body(&pod))),
                None => Err(Status::pod_not_found(name)),
            }
        }
        _ => Err(Status::no_such_path()),
    }
}

/// A write (`serve --writes`): its path, then its body (at most [`MAX_BODY_BYTES`]), then
/// the store (writes.rs).
async fn write(app: &App, request: Request) -> Result<Response, Status> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().trim_end_matches('/');
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let (namespace, name) = match segments.as_slice() {
        ["api", "v1", "namespaces", ns, "pods"] if !ns.is_empty() => (*ns, None),
        ["api", "v1", "namespaces", ns, "pods", name] if !ns.is_empty() && !name.is_empty() => {
            (*ns, Some(*name))
        }
        // Paths that are served, for reading only.
        []
        | ["version"]
        | ["api"]
        | ["apis"]
        | ["api", "v1"]
        | ["api", "v1", "pods"]
        | ["loadgen", "status"]
        | ["openapi", "v3", ..] => {
            return Err(Status::method_not_allowed(parts.method.as_str()));
        }
        _ => return Err(Status::no_such_path()),
    };
    let format = Format::negotiate(
        parts
            .headers
            .get(header::ACCEPT)
            .and_then(|a| a.to_str().ok()),
    )?;
    // A declared length over the limit is refused before a byte of the body is read; a
    // chunked body is counted as it comes and refused once it passes the limit.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|l| l.to_str().ok())
        .and_then(|l| l.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return Err(Status::request_entity_too_large(MAX_BODY_BYTES));
    }
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(error) => {
            let too_large = std::error::Error::source(&error)
                .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
            return Err(if too_large {
                Status::request_entity_too_large(MAX_BODY_BYTES)
            } else {
                Status::bad_request(format!("cannot read the request body: {error}"))
            });
        }
    };
    let query = Query::parse(parts.uri.query().unwrap_or(""));
    let dry_run = match query.get("dryRun") {
        None => false,
        Some("All") => true,
        Some(other) => {
            return Err(Status::bad_request(format!(
                "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
            )))
        }
    };
    let request = WriteRequest {
        method: &parts.method,
        namespace,
        name,
        content_type: parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|t| t.to_str().ok())
            .map(media_type),
        dry_run,
        field_validation: FieldValidation::parse(query.get("fieldValidation"))?,
        body: &body,
    };
    let written = writes::write(&app.store, &request)?;
    let mut response = (
        written.code,
        [(header::CONTENT_TYPE, format.content_type())],
        format.pod_body(&written.pod),
    )
        .into_response();
    for warning in &written.warnings {
        // As the API server writes them: code 299, agent "-", the text quoted.
        let value = format!("299 - {}", serde_json::Value::from(warning.as_str()));
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    Ok(response)
}

/// `response` with `Connection: close`: a refused write's body may still be on its way, and
/// the connection cannot carry another request until it has been read.
fn close_after(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// `GET /loadgen/status` (not a Kubernetes path): what is served and whether the churn is done,
/// so a client driving the server from outside knows when the state is final.
fn status(app: &App) -> Value {
    let churn = match *app.churn.borrow() {
        Some(summary) => serde_json::json!({
            "done": true,
            "events": summary.events,
            "seconds": summary.seconds,
            "stopped": summary.stopped,
        }),
        None => serde_json::json!({ "done": false }),
    };
    serde_json::json!({
        "serving": app.label,
        "resourceVersion": app.store.resource_version().to_string(),
        "oldestResourceVersion": app.store.oldest().to_string(),
        "pods": app.store.len(),
        "churn": churn,
        "faults": app.faults.counts.report(),
    })
}

/// The query parameters of a collection request, checked.
#[derive(Debug, Default)]
struct Query {
    params: HashMap<String, String>,
}

impl Query {
    fn parse(raw: &str) -> Self {
        let params = form_urlencoded::parse(raw.as_bytes())
            .map(|(key, value)| (key.into_owned(), value.into_owned()))
            .collect();
        Self { params }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.params
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn flag(&self, name: &str) -> Result<bool, Status> {
        match self.get(name) {
            None | Some("0") | Some("false") => Ok(false),
            Some("1") | Some("true") => Ok(true),
            Some(other) => Err(Status::bad_request(format!(
                "{name}: Invalid value: \"{other}\": expected true or false"
            ))),
        }
    }

    fn number(&self, name: &str) -> Result<Option<u64>, Status> {
        self.get(name)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Status::bad_request(format!(
                        "{name}: Invalid value: \"{v}\": expected a non-negative integer"
                    ))
                })
            })
            .transpose()
    }

    /// `resourceVersion`: `None` when unset, a number otherwise; anything else is 400.
    fn resource_version(&self) -> Result<Option<u64>, Status> {
        self.get("resourceVersion")
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    Status::bad_request(format!(
                        "resourceVersion: Invalid value: \"{v}\": invalid resource version"
                    ))
                })
            })
            .transpose()
    }

    fn resource_version_match(&self) -> Result<Option<&str>, Status> {
        match self.get("resourceVersionMatch") {
            None => Ok(None),
            Some(m @ ("NotOlderThan" | "Exact")) => Ok(Some(m)),
            // The API server's option validation: 422, like the other rules it checks.
            Some(other) => Err(Status::invalid(format!(
                "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
            ))),
        }
    }

    /// Selectors would filter what the server sends; it does not implement them, and
    /// answering unfiltered would be wrong, so they are refused.
    fn no_selectors(&self) -> Result<(), Status> {
        for name in ["labelSelector", "fieldSelector"] {
            if let Some(v) = self.get(name) {
                return Err(Status::bad_request(format!(
                    "{name}: \"{v}\": loadgen serve does not support selectors"
                )));
            }
        }
        Ok(())
    }
}

fn collection(
    app: &App,
    namespace: Option<&str>,
    query: &Query,
    format: Format,
    progress: Option<&Arc<WatchProgress>>,
) -> Result<Response, Status> {
    query.no_selectors()?;
    let read = Read {
        app,
        namespace,
        query,
        resource_version: query.resource_version()?,
        version_match: query.resource_version_match()?,
        format,
    };
    if query.flag("watch")? {
        watch(read, progress)
    } else {
        // The API server's list validation: an initial-events stream is a watch's.
        if query.params.contains_key("sendInitialEvents") {
            return Err(Status::invalid(
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
            ));
        }
        list(read)
    }
}

/// A list or watch of a collection: what it reads and how it answers.
#[derive(Clone, Copy)]
struct Read<'a> {
    app: &'a App,
    namespace: Option<&'a str>,
    query: &'a Query,
    resource_version: Option<u64>,
    version_match: Option<&'a str>,
    format: Format,
}

fn list(read: Read<'_>) -> Result<Response, Status> {
    // 0 (or none) is no limit.
    let limit = read.query.number("limit")?.unwrap_or(0) as usize;
    let page = match read.query.get("continue") {
        Some(token) => read
            .app
            .store
            .next_page(token, read.namespace, limit)
            .map_err(|e| match e {
                ContinueError::Expired => Status::expired(e.to_string()),
                ContinueError::Malformed | ContinueError::PastEnd => {
                    Status::bad_request(format!("continue: Invalid value: \"{token}\": {e}"))
                }
            })?,
        None => {
            let current = read.app.store.resource_version();
            match (read.resource_version, read.version_match) {
                (Some(rv), _) if rv > current => return Err(Status::too_large(rv, current)),
                // Only the newest state is kept: an exact older one is gone.
                (Some(rv), Some("Exact")) if rv != current => {
                    return Err(Status::expired(format!(
                        "too old resource version: {rv} ({current})"
                    )))
                }
                (None, Some(_)) => {
                    return Err(Status::invalid(
                        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden \
                         unless resourceVersion is provided",
                    ))
                }
                _ => {}
            }
            read.app.store.first_page(read.namespace, limit)
        }
    };
    Ok(body_response(read.format, read.format.list_body(&page)))
}

fn watch(read: Read<'_>, progress: Option<&Arc<WatchProgress>>) -> Result<Response, Status> {
    let bookmarks = read.query.flag("allowWatchBookmarks")?;
    let timeout = read
        .query
        .number("timeoutSeconds")?
        .map(Duration::from_secs);
    let send_initial_events = read.query.get("sendInitialEvents").is_some();
    let initial_events = if send_initial_events {
        read.query.flag("sendInitialEvents")?
    } else {
        // The legacy rule: a watch from "" or "0" starts with the current state as ADDED.
        matches!(read.resource_version, None | Some(0))
    };
    if send_initial_events {
        if read.version_match != Some("NotOlderThan") {
            return Err(Status::invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting \
                 resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(Status::invalid(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires \
                 allowWatchBookmarks=true",
            ));
        }
    } else if read.version_match.is_some() {
        return Err(Status::invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch \
             unless sendInitialEvents is provided",
        ));
    }
    let from = if initial_events {
        if let Some(rv) = read.resource_version {
            let current = read.app.store.resource_version();
            if rv > current {
                return Err(Status::too_large(rv, current));
            }
        }
        None
    } else {
        // Without initial events, "" and "0" mean "from now".
        Some(match read.resource_version {
            None | Some(0) => read.app.store.resource_version(),
            Some(rv) => rv,
        })
    };
    let options = WatchOptions {
        namespace: read.namespace.map(Arc::from),
        bookmarks,
        initial_events_end: send_initial_events && initial_events,
        timeout,
        bookmark_interval: read.app.bookmark_interval,
        format: read.format,
    };
    let body = match read.app.store.watch(read.namespace, from) {
        Ok(start) => {
            // The watchdog of the connection (limits.rs) follows what this watch has sent,
            // until the body (and with it the guard) is dropped.
            let progress = progress.map(|p| p.start(start.resource_version));
            let watcher = Watcher::new(start, options, read.app.shutdown.clone());
            let chunks = futures_util::stream::unfold(
                (watcher, progress),
                |(mut watcher, progress)| async move {
                    let chunk = watcher.next_chunk().await?;
                    if let Some(progress) = &progress {
                        progress.sent(watcher.resource_version());
                    }
                    Some((chunk, (watcher, progress)))
                },
            );
            Body::from_stream(Arc::clone(&read.app.faults).watch_body(chunks))
        }
        // The real server answers a watch from a version it no longer has with 200 and one
        // ERROR event; other refusals are plain error responses.
        Err(status) if status.code == 410 => Body::from(read.format.error(&status)),
        Err(status) => return Err(status),
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, read.format.watch_content_type())
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .expect("a static header is valid"))
}

fn json_response(value: &Value) -> Response {
    raw_json_response(
        StatusCode::OK,
        serde_json::to_vec(value)
            .expect("a JSON value always serialises")
            .into(),
    )
}

fn raw_json_response(status: StatusCode, body: bytes::Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn body_response(format: Format, body: bytes::Bytes) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, format.content_type())],
        body,
    )
        .into_response()
}

fn status_response_as(format: Format, status: &Status) -> Response {
    let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (
        code,
        [(header::CONTENT_TYPE, format.content_type())],
        format.status_body(status),
    )
        .into_response();
    // As the API server does for every status that says when to retry (429s, 5xx).
    if let Some(seconds) = status.retry_after_seconds() {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_checked() {
        let q = Query::parse("watch=true&resourceVersion=abc&limit=-1&allowWatchBookmarks=maybe");
        assert!(q.flag("watch").unwrap());
        assert_eq!(q.resource_version().unwrap_err().code, 400);
        assert_eq!(q.number("limit").unwrap_err().code, 400);
        assert_eq!(q.flag("allowWatchBookmarks").unwrap_err().code, 400);
        let q = Query::parse("resourceVersion=&watch=0");
        assert_eq!(q.resource_version().unwrap(), None);
        assert!(!q.flag("watch").unwrap());
    }
}
