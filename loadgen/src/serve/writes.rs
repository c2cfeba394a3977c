//! Writes of pods (`serve --writes`), as the API server answers them (docs/wire.md, "Writes"):
//! create (`POST`), replace (`PUT`), JSON, merge and strategic merge patches (`PATCH`) and
//! delete (`DELETE`), each a watch event at a new resource version in the same log the churn
//! writes, and every refusal the API server's `Status`.
//!
//! What is the API server's and what is simpler here:
//! - Bodies are JSON (`application/json`; patches `application/json-patch+json`,
//!   `application/merge-patch+json` and `application/strategic-merge-patch+json`); protobuf,
//!   YAML and server-side apply get `415 UnsupportedMediaType`.
//! - Validation is the part a client meets first: a name (or `generateName`) that is an RFC
//!   1123 subdomain, at least one container, each with a unique name and an image; the
//!   namespace of the body matches the URL's (else `400`, as the API server). Updates may not
//!   change the spec beyond the fields the API server lets change (images, tolerations,
//!   `activeDeadlineSeconds`, `terminationGracePeriodSeconds`).
//! - The server sets `uid`, `resourceVersion`, `creationTimestamp` and, on create,
//!   `status.phase: Pending`; it does not default the spec (no `restartPolicy`, no
//!   `dnsPolicy`). `status` cannot be written (the API server keeps it for the `status`
//!   subresource).
//! - There is no kubelet: a delete is immediate, as the API server's is for a pod on no node
//!   (no `deletionTimestamp` first).
//! - A strategic merge patch is a merge patch whose lists of containers, volumes, env vars,
//!   ports and mounts merge by their keys (`name`, `containerPort`, `mountPath`), with
//!   `$patch: delete` and `$patch: replace` in them; the `$setElementOrder` and `$retainKeys`
//!   directives are ignored. That is what `kubectl apply` sends for pods.
//! - The churn owns its own pods: a client's change to one of them lasts until the churn's
//!   next event for that pod replaces it.

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value};

use super::objects::Status;
use super::store::{Store, StoredPod, Write};

/// The largest request body accepted: the API server's default `--max-request-body-bytes`
/// (3 MiB, `DefaultMaxRequestSizeBytes` in apiserver's `server/config.go`).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// What a write request says, read from its head and body.
#[derive(Debug)]
pub struct WriteRequest<'a> {
    /// `POST`, `PUT`, `PATCH` or `DELETE`.
    pub method: &'a Method,
    /// The URL's namespace.
    pub namespace: &'a str,
    /// The URL's pod name (none for a create).
    pub name: Option<&'a str>,
    /// `Content-Type`, without parameters.
    pub content_type: Option<&'a str>,
    /// `?dryRun=All`: check and answer, store nothing.
    pub dry_run: bool,
    /// `?fieldValidation=`: what to do about fields a pod does not have.
    pub field_validation: FieldValidation,
    /// The body.
    pub body: &'a [u8],
}

/// `?fieldValidation=`: unknown fields are refused (`Strict`), warned about (`Warn`, the
/// default) or dropped quietly (`Ignore`). All three drop them from the stored pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// 400 for an unknown field.
    Strict,
    /// A `Warning` header per unknown field.
    Warn,
    /// Nothing said.
    Ignore,
}

impl FieldValidation {
    /// The query parameter's value; anything else is the API server's 400.
    pub fn parse(value: Option<&str>) -> Result<Self, Status> {
        match value {
            None | Some("Warn") => Ok(Self::Warn),
            Some("Strict") => Ok(Self::Strict),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(Status::bad_request(format!(
                "fieldValidation: Invalid value: \"{other}\": fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\""
            ))),
        }
    }
}

/// A write's answer: the HTTP status, the pod (for a delete, its last state), and warnings for
/// `Warning` headers.
#[derive(Debug)]
pub struct Written {
    /// 201 for a create, 200 otherwise.
    pub code: StatusCode,
    /// What the response body carries.
    pub pod: Arc<StoredPod>,
    /// Unknown fields, when `fieldValidation=Warn`.
    pub warnings: Vec<String>,
}

/// Carries out `request` on `store`.
pub fn write(store: &Store, request: &WriteRequest<'_>) -> Result<Written, Status> {
    let mut warnings = Vec::new();
    let (code, pod) = match (request.method.as_str(), request.name) {
        ("POST", None) => {
            let pod = decode_pod(request, &mut warnings)?;
            (StatusCode::CREATED, create(store, request, pod)?)
        }
        ("PUT", Some(name)) => {
            let pod = decode_pod(request, &mut warnings)?;
            (StatusCode::OK, replace(store, request, name, pod)?)
        }
        ("PATCH", Some(name)) => (StatusCode::OK, patch(store, request, name, &mut warnings)?),
        ("DELETE", Some(name)) => (StatusCode::OK, delete(store, request, name)?),
        (method, _) => return Err(Status::method_not_allowed(method)),
    };
    Ok(Written {
        code,
        pod,
        warnings,
    })
}

/// The media type of `content_type`, without parameters (`; charset=utf-8`).
pub fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

fn decode_pod(request: &WriteRequest<'_>, warnings: &mut Vec<String>) -> Result<Pod, Status> {
    match request.content_type {
        // kubectl and client-go send JSON; a client that names no type means it too.
        None | Some("application/json") => {}
        Some(other) => {
            return Err(Status::unsupported_media_type(other, "application/json"));
        }
    }
    let value: Value = serde_json::from_slice(request.body).map_err(cannot_decode)?;
    typed_pod(value, request.field_validation, warnings)
}

/// `value` as a typed pod: its `kind` and `apiVersion` (when given) must be a v1 Pod's, and
/// fields a pod does not have are handled as `validation` says.
fn typed_pod(
    value: Value,
    validation: FieldValidation,
    warnings: &mut Vec<String>,
) -> Result<Pod, Status> {
    if !value.is_object() {
        return Err(cannot_decode("the body is not a JSON object"));
    }
    for (field, expected) in [("kind", "Pod"), ("apiVersion", "v1")] {
        match value.get(field) {
            None => {}
            Some(Value::String(s)) if s == expected || s.is_empty() => {}
            Some(other) => {
                return Err(Status::bad_request(format!(
                "{field} of the body is {other}, expected \"{expected}\": this path is for v1 Pods"
            )))
            }
        }
    }
    let pod: Pod = serde_json::from_value(value.clone()).map_err(cannot_decode)?;
    if validation != FieldValidation::Ignore {
        let known = serde_json::to_value(&pod).map_err(cannot_decode)?;
        let mut unknown = Vec::new();
        unknown_fields(&value, &known, "", &mut unknown);
        if let Some(first) = unknown.first() {
            if validation == FieldValidation::Strict {
                // The API server names every unknown field; the first says enough to fix it.
                return Err(Status::bad_request(format!(
                    "strict decoding error: unknown field \"{first}\""
                )));
            }
            warnings.extend(unknown.iter().map(|f| format!("unknown field \"{f}\"")));
        }
    }
    Ok(pod)
}

/// The paths of the fields of `given` that `known` (the same object decoded and encoded again)
/// lost: the fields a pod does not have. A `null` is no field.
fn unknown_fields(given: &Value, known: &Value, path: &str, out: &mut Vec<String>) {
    match (given, known) {
        (Value::Object(given), Value::Object(known)) => {
            for (key, value) in given {
                let field = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match known.get(key) {
                    Some(kept) => unknown_fields(value, kept, &field, out),
                    None if value.is_null() => {}
                    // An empty map or list may be left out when encoded again.
                    None if is_empty(value) => {}
                    None => out.push(field),
                }
            }
        }
        (Value::Array(given), Value::Array(known)) => {
            for (i, (value, kept)) in given.iter().zip(known).enumerate() {
                unknown_fields(value, kept, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.values().all(|v| v.is_null() || is_empty(v)),
        Value::Array(list) => list.is_empty(),
        _ => false,
    }
}

/// The API server's 400 for a body it cannot decode as a pod.
fn cannot_decode(error: impl std::fmt::Display) -> Status {
    Status::bad_request(format!(
        "Pod in version \"v1\" cannot be handled as a Pod: {error}"
    ))
}

/// The body's namespace is the URL's (set from it when empty); another is the API server's 400.
fn check_namespace(pod: &mut Pod, namespace: &str) -> Result<(), Status> {
    fill_or_match(&mut pod.metadata.namespace, namespace, |_| {
        Status::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    })
}

/// The body's name is the URL's (set from it when empty).
fn check_name(pod: &mut Pod, name: &str) -> Result<(), Status> {
    fill_or_match(&mut pod.metadata.name, name, |other| {
        Status::bad_request(format!(
            "the name of the object ({other}) does not match the name on the URL ({name})"
        ))
    })
}

/// Sets an empty `field` to the URL's `want`; a different value is `mismatch`'s error.
fn fill_or_match(
    field: &mut Option<String>,
    want: &str,
    mismatch: impl FnOnce(&str) -> Status,
) -> Result<(), Status> {
    match field.as_deref() {
        None | Some("") => {
            *field = Some(want.to_owned());
            Ok(())
        }
        Some(got) if got == want => Ok(()),
        Some(other) => Err(mismatch(other)),
    }
}

fn create(
    store: &Store,
    request: &WriteRequest<'_>,
    mut pod: Pod,
) -> Result<Arc<StoredPod>, Status> {
    check_namespace(&mut pod, request.namespace)?;
    let meta = &mut pod.metadata;
    if meta.name.as_deref().unwrap_or_default().is_empty() {
        if let Some(prefix) = meta.generate_name.as_deref().filter(|p| !p.is_empty()) {
            meta.name = Some(generated_name(prefix));
        }
    }
    validate(&pod)?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let meta = &mut pod.metadata;
    meta.uid = Some(new_uid());
    meta.creation_timestamp = Some(now());
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    // The kubelet writes status; a new pod waits for one.
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Pending".to_owned()),
        ..Default::default()
    });
    store.write(
        request.namespace,
        &name,
        request.dry_run,
        |current, _| match current {
            Some(_) => Err(Status::already_exists(&name)),
            None => Ok(Write::Put(Box::new(pod))),
        },
    )
}

fn replace(
    store: &Store,
    request: &WriteRequest<'_>,
    name: &str,
    mut pod: Pod,
) -> Result<Arc<StoredPod>, Status> {
    check_namespace(&mut pod, request.namespace)?;
    check_name(&mut pod, name)?;
    validate(&pod)?;
    store.write(request.namespace, name, request.dry_run, |current, _| {
        let current = current.ok_or_else(|| Status::pod_not_found(name))?;
        updated(current, pod)
    })
}

fn patch(
    store: &Store,
    request: &WriteRequest<'_>,
    name: &str,
    warnings: &mut Vec<String>,
) -> Result<Arc<StoredPod>, Status> {
    let kind = match request.content_type {
        Some("application/merge-patch+json") => PatchKind::Merge,
        Some("application/strategic-merge-patch+json") => PatchKind::Strategic,
        Some("application/json-patch+json") => PatchKind::Json,
        other => {
            return Err(Status::unsupported_media_type(
                other.unwrap_or("none"),
                "application/json-patch+json, application/merge-patch+json, \
                 application/strategic-merge-patch+json",
            ))
        }
    };
    let patch: Value = serde_json::from_slice(request.body)
        .map_err(|e| Status::bad_request(format!("error decoding patch: {e}")))?;
    let shape_ok = match kind {
        PatchKind::Json => patch.is_array(),
        PatchKind::Merge | PatchKind::Strategic => patch.is_object(),
    };
    if !shape_ok {
        return Err(Status::bad_request(
            "error decoding patch: a JSON patch is an array of operations, a merge patch an object",
        ));
    }
    store.write(request.namespace, name, request.dry_run, |current, _| {
        let current = current.ok_or_else(|| Status::pod_not_found(name))?;
        let mut value: Value = serde_json::from_slice(current.object())
            .map_err(|e| Status::internal_error(format!("the stored pod does not decode: {e}")))?;
        match kind {
            PatchKind::Merge => merge(&mut value, &patch),
            PatchKind::Strategic => strategic_merge(&mut value, &patch, ""),
            // The API server's answer to a JSON patch that does not apply.
            PatchKind::Json => json_patch(&mut value, &patch).map_err(Status::invalid)?,
        }
        let mut pod = typed_pod(value, request.field_validation, warnings)?;
        check_namespace(&mut pod, request.namespace)?;
        check_name(&mut pod, name)?;
        validate(&pod)?;
        updated(current, pod)
    })
}

/// The patch types served.
#[derive(Debug, Clone, Copy)]
enum PatchKind {
    /// RFC 6902 (`application/json-patch+json`).
    Json,
    /// RFC 7386 (`application/merge-patch+json`).
    Merge,
    /// Kubernetes' strategic merge patch, for what kubectl sends (see the module documentation).
    Strategic,
}

/// `pod` replacing `current`, checked as the API server checks an update: its resource
/// version and uid, when given, are a precondition; the spec may change only where a pod's
/// may; the status, uid and creation time stay the server's. An update that changes nothing
/// writes nothing (no new version, no event), as etcd's guaranteed update does.
fn updated(current: &StoredPod, mut pod: Pod) -> Result<Write, Status> {
    let old = current.typed()?;
    let name = &*current.name;
    if let Some(rv) = pod
        .metadata
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty())
    {
        if rv != current.resource_version.to_string() {
            return Err(Status::conflict(
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
    }
    if let (Some(uid), Some(old_uid)) = (pod.metadata.uid.as_deref(), old.metadata.uid.as_deref()) {
        if !uid.is_empty() && uid != old_uid {
            return Err(Status::conflict(
                name,
                &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"),
            ));
        }
    }
    if mutable_parts_removed(&pod) != mutable_parts_removed(&old) {
        return Err(Status::invalid_pod(
            name,
            &[(
                "spec".to_owned(),
                "FieldValueForbidden",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,\
                 `spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` \
                 (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` \
                 (allow it to be set to 1 if it was previously negative)"
                    .to_owned(),
            )],
        ));
    }
    pod.metadata.uid = old.metadata.uid.clone();
    pod.metadata.creation_timestamp = old.metadata.creation_timestamp.clone();
    pod.metadata.resource_version = old.metadata.resource_version.clone();
    pod.metadata.deletion_timestamp = old.metadata.deletion_timestamp.clone();
    pod.status = old.status.clone();
    if pod == old {
        return Ok(Write::Keep);
    }
    Ok(Write::Put(Box::new(pod)))
}

/// The spec without what an update may change, for comparing an old spec with a new one.
fn mutable_parts_removed(pod: &Pod) -> Option<Value> {
    let mut spec = pod.spec.clone()?;
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        container.image = None;
    }
    spec.active_deadline_seconds = None;
    spec.tolerations = None;
    spec.termination_grace_period_seconds = None;
    serde_json::to_value(spec).ok()
}

fn delete(store: &Store, request: &WriteRequest<'_>, name: &str) -> Result<Arc<StoredPod>, Status> {
    let options: Value = if request.body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(request.body).map_err(|e| {
            Status::bad_request(format!(
                "DeleteOptions in version \"v1\" cannot be handled as a DeleteOptions: {e}"
            ))
        })?
    };
    let precondition = |field: &str| {
        options["preconditions"][field]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let (uid, resource_version) = (precondition("uid"), precondition("resourceVersion"));
    store.write(request.namespace, name, request.dry_run, |current, _| {
        let current = current.ok_or_else(|| Status::pod_not_found(name))?;
        if let Some(uid) = &uid {
            let old = current.typed()?;
            let old_uid = old.metadata.uid.unwrap_or_default();
            if *uid != old_uid {
                return Err(Status::conflict(
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"),
                ));
            }
        }
        if let Some(rv) = &resource_version {
            let old_rv = current.resource_version.to_string();
            if *rv != old_rv {
                return Err(Status::conflict(
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {old_rv}"),
                ));
            }
        }
        Ok(Write::Delete)
    })
}

/// The checks of the API server's pod validation a client meets first (see the module
/// documentation); every failure is a cause of one 422.
fn validate(pod: &Pod) -> Result<(), Status> {
    let mut causes: Vec<(String, &'static str, String)> = Vec::new();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        causes.push((
            "metadata.name".into(),
            "FieldValueRequired",
            "Required value: name or generateName is required".into(),
        ));
    } else if !is_dns_subdomain(name) {
        causes.push((
            "metadata.name".into(),
            "FieldValueInvalid",
            format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ),
        ));
    }
    let containers = pod.spec.as_ref().map_or(&[][..], |s| &s.containers[..]);
    if containers.is_empty() {
        causes.push((
            "spec.containers".into(),
            "FieldValueRequired",
            "Required value".into(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, container) in containers.iter().enumerate() {
        let field = |f: &str| format!("spec.containers[{i}].{f}");
        if container.name.is_empty() {
            causes.push((field("name"), "FieldValueRequired", "Required value".into()));
        } else if !seen.insert(container.name.as_str()) {
            causes.push((
                field("name"),
                "FieldValueDuplicate",
                format!("Duplicate value: \"{}\"", container.name),
            ));
        }
        if container.image.as_deref().unwrap_or_default().is_empty() {
            causes.push((
                field("image"),
                "FieldValueRequired",
                "Required value".into(),
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(Status::invalid_pod(name, &causes))
    }
}

/// An RFC 1123 subdomain: at most 253 characters, dot-separated labels of lower-case
/// alphanumerics and '-', each starting and ending with an alphanumeric.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
                }
                _ => false,
            }
        })
}

/// `prefix` and five random characters, as the API server's `generateName` (its alphabet has
/// no vowels, so no words, and no look-alike characters).
fn generated_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut name = prefix.to_owned();
    for _ in 0..5 {
        name.push(char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]));
    }
    name
}

/// A random (version 4) UUID.
fn new_uid() -> String {
    let n = fastrand::u128(..) & !(0xf << 76) & !(0x3 << 62) | (0x4 << 76) | (0x2 << 62);
    let hex = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let second = i64::try_from(super::store::unix_nanos() / 1_000_000_000).unwrap_or(0);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(second).unwrap_or_default(),
    )
}

/// RFC 7386 JSON merge patch: objects merge, `null` removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// RFC 6902 JSON patch: `add`, `remove`, `replace`, `move`, `copy` and `test`, in order, on
/// `target` (left as it was if one fails).
pub fn json_patch(target: &mut Value, operations: &Value) -> Result<(), String> {
    let mut patched = target.clone();
    for (i, operation) in operations.as_array().into_iter().flatten().enumerate() {
        let field = |name: &str| {
            operation
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("operation {i}: missing \"{name}\""))
        };
        let value = || {
            operation
                .get("value")
                .cloned()
                .ok_or_else(|| format!("operation {i}: missing \"value\""))
        };
        let path = field("path")?;
        match field("op")? {
            "add" => pointer_add(&mut patched, path, value()?)?,
            "remove" => {
                pointer_remove(&mut patched, path)?;
            }
            "replace" => {
                pointer_remove(&mut patched, path)?;
                pointer_add(&mut patched, path, value()?)?;
            }
            "move" => {
                let moved = pointer_remove(&mut patched, field("from")?)?;
                pointer_add(&mut patched, path, moved)?;
            }
            "copy" => {
                let from = field("from")?;
                let copied = patched
                    .pointer(from)
                    .cloned()
                    .ok_or_else(|| format!("copy from a missing path: {from}"))?;
                pointer_add(&mut patched, path, copied)?;
            }
            "test" => {
                if patched.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("operation {i}: unknown op \"{other}\"")),
        }
    }
    *target = patched;
    Ok(())
}

/// `pointer` split into its parent and its last token (unescaped); `None` for the root.
fn split_pointer(pointer: &str) -> Result<Option<(&str, String)>, String> {
    if pointer.is_empty() {
        return Ok(None);
    }
    let Some(at) = pointer.rfind('/') else {
        return Err(format!("a JSON pointer starts with '/': {pointer}"));
    };
    let token = pointer[at + 1..].replace("~1", "/").replace("~0", "~");
    Ok(Some((&pointer[..at], token)))
}

fn pointer_add(target: &mut Value, pointer: &str, value: Value) -> Result<(), String> {
    let Some((parent, token)) = split_pointer(pointer)? else {
        *target = value;
        return Ok(());
    };
    match target.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.insert(token, value);
            Ok(())
        }
        Some(Value::Array(list)) => {
            let at = if token == "-" {
                list.len()
            } else {
                token
                    .parse::<usize>()
                    .ok()
                    .filter(|&at| at <= list.len())
                    .ok_or_else(|| format!("add to an array at a bad index: {pointer}"))?
            };
            list.insert(at, value);
            Ok(())
        }
        _ => Err(format!("add to a missing path: {pointer}")),
    }
}

fn pointer_remove(target: &mut Value, pointer: &str) -> Result<Value, String> {
    let Some((parent, token)) = split_pointer(pointer)? else {
        return Err("cannot remove the whole object".to_owned());
    };
    let removed = match target.pointer_mut(parent) {
        Some(Value::Object(map)) => map.remove(&token),
        Some(Value::Array(list)) => match token.parse::<usize>() {
            Ok(at) if at < list.len() => Some(list.remove(at)),
            _ => None,
        },
        _ => None,
    };
    removed.ok_or_else(|| format!("remove a missing path: {pointer}"))
}

/// The key the elements of the list `field` of a pod merge by in a strategic merge patch (the
/// `patchMergeKey` of the Go types), if it is one.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => Some("name"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "hostAliases" => Some("ip"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// A strategic merge patch, for what `kubectl apply` sends for pods (see the module
/// documentation): a merge patch whose keyed lists merge element by element.
pub fn strategic_merge(target: &mut Value, patch: &Value, field: &str) {
    match patch {
        Value::Object(patch) => {
            if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
                let mut replacement = Value::Object(patch.clone());
                if let Value::Object(map) = &mut replacement {
                    map.remove("$patch");
                }
                *target = replacement;
                return;
            }
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let Value::Object(map) = target else {
                return;
            };
            for (key, value) in patch {
                if key.starts_with('$') {
                    // Directives ($setElementOrder/…, $retainKeys, $deleteFromPrimitiveList/…)
                    // order or prune what the merge already wrote; the content is the same.
                    continue;
                }
                if value.is_null() {
                    map.remove(key);
                } else {
                    let slot = map.entry(key.clone()).or_insert(Value::Null);
                    strategic_merge(slot, value, key);
                }
            }
        }
        Value::Array(items) => match (merge_key(field), target) {
            (Some(key), Value::Array(existing)) => merge_list(existing, items, key),
            (_, target) => {
                *target = Value::Array(
                    items
                        .iter()
                        .filter(|item| item.get("$patch").is_none())
                        .cloned()
                        .collect(),
                )
            }
        },
        other => *target = other.clone(),
    }
}

/// Merges the patch's `items` into `existing` by `key`: an element with the key of an existing
/// one merges into it (or, with `$patch: delete`, removes it); a new one is appended.
fn merge_list(existing: &mut Vec<Value>, items: &[Value], key: &str) {
    if items
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *existing = items
            .iter()
            .filter(|item| item.get("$patch").is_none())
            .cloned()
            .collect();
        return;
    }
    for item in items {
        let id = item.get(key);
        let found = id.and_then(|id| existing.iter().position(|e| e.get(key) == Some(id)));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (found, delete) {
            (Some(at), true) => {
                existing.remove(at);
            }
            (None, true) => {}
            (Some(at), false) => strategic_merge(&mut existing[at], item, ""),
            (None, false) => {
                let mut added = Value::Null;
                strategic_merge(&mut added, item, "");
                existing.push(added);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_merge_patch_merges_objects_and_removes_nulls() {
        let mut pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [1, 2]}});
        merge(
            &mut pod,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "spec": {"x": [3]}}),
        );
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "spec": {"x": [3]}})
        );
    }

    #[test]
    fn a_strategic_merge_patch_merges_containers_by_name() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"},
        ]}});
        strategic_merge(
            &mut pod,
            &json!({"spec": {
                "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                "containers": [
                    {"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]},
                    {"name": "b", "$patch": "delete"},
                    {"name": "c", "image": "c:1"},
                ],
            }}),
            "",
        );
        assert_eq!(
            pod,
            json!({"spec": {"containers": [
                {"name": "a", "image": "a:2", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                {"name": "c", "image": "c:1"},
            ]}})
        );
    }

    #[test]
    fn a_json_patch_applies_in_order_or_not_at_all() {
        let mut pod = json!({"metadata": {"labels": {"a/b": "1"}}, "list": [1, 3]});
        json_patch(
            &mut pod,
            &json!([
                {"op": "add", "path": "/metadata/labels/c", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/a~1b"},
                {"op": "add", "path": "/list/1", "value": 2},
                {"op": "add", "path": "/list/-", "value": 4},
                {"op": "replace", "path": "/list/0", "value": 0},
                {"op": "copy", "from": "/list/0", "path": "/zero"},
                {"op": "move", "from": "/zero", "path": "/metadata/zero"},
                {"op": "test", "path": "/metadata/zero", "value": 0},
            ]),
        )
        .unwrap();
        assert_eq!(
            pod,
            json!({"metadata": {"labels": {"c": "2"}, "zero": 0}, "list": [0, 2, 3, 4]})
        );
        let before = pod.clone();
        for bad in [
            json!([{"op": "add", "path": "/metadata/x", "value": 1}, {"op": "remove", "path": "/nope"}]),
            json!([{"op": "test", "path": "/list/0", "value": 9}]),
            json!([{"op": "add", "path": "/list/9", "value": 1}]),
            json!([{"op": "frobnicate", "path": "/list"}]),
            json!([{"op": "add", "path": "no-slash", "value": 1}]),
            json!([{"op": "replace", "path": "/missing/deep", "value": 1}]),
        ] {
            assert!(json_patch(&mut pod, &bad).is_err(), "{bad}");
            assert_eq!(pod, before, "a failed patch changes nothing");
        }
    }

    #[test]
    fn names_are_rfc_1123_subdomains() {
        for good in ["a", "pod-1", "a.b-c", "0"] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", &"a".repeat(254)] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn uids_are_version_4_uuids_and_generated_names_keep_the_prefix() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(&uid[14..15], "4", "{uid}");
        assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "{uid}");
        let name = generated_name("web-");
        assert!(name.starts_with("web-") && name.len() == 9, "{name}");
    }

    #[test]
    fn unknown_fields_are_found_by_path() {
        let given = json!({"metadata": {"name": "x", "bogus": 1},
            "spec": {"containers": [{"name": "a", "image": "i", "imagePolicy": "x"}]}});
        let pod: Pod = serde_json::from_value(given.clone()).unwrap();
        let known = serde_json::to_value(&pod).unwrap();
        let mut unknown = Vec::new();
        unknown_fields(&given, &known, "", &mut unknown);
        assert_eq!(
            unknown,
            ["metadata.bogus", "spec.containers[0].imagePolicy"]
        );
    }
}
