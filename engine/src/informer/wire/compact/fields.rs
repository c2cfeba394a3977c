//! Fields a compact object decodes besides its metadata, declared for index functions.
//!
//! A declared field is a string field (such as a pod's `spec.nodeName`), named by its JSON path
//! and, for protobuf, by its field numbers along the same path (protobuf has no names on the
//! wire). The numbers are the `.proto` files' (k8s.io/api/core/v1/generated.proto for pods);
//! [`pod`] has the ones pods are usually indexed by.

/// A declared field: its JSON path (`spec.nodeName`) and its protobuf field numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldPath {
    name: String,
    json: Vec<String>,
    protobuf: Vec<u32>,
}

impl FieldPath {
    /// The string field at `json_path` (dot-separated names, as in a field selector), whose
    /// protobuf field numbers along the same path are `protobuf`.
    ///
    /// ```
    /// use kcache::informer::wire::FieldPath;
    /// let node = FieldPath::new("spec.nodeName", &[2, 10]);
    /// assert_eq!(node.name(), "spec.nodeName");
    /// ```
    ///
    /// # Panics
    ///
    /// When the two paths differ in length, or either is empty: a declaration is code, not
    /// input, and a wrong one is a bug to hear about at once.
    pub fn new(json_path: &str, protobuf: &[u32]) -> Self {
        let json: Vec<String> = json_path.split('.').map(str::to_owned).collect();
        assert!(
            !json_path.is_empty() && json.len() == protobuf.len(),
            "a field path names as many protobuf field numbers as JSON names: \
             {json_path:?} against {protobuf:?}"
        );
        Self {
            name: json_path.to_owned(),
            json,
            protobuf: protobuf.to_vec(),
        }
    }

    /// The JSON path, dot-separated.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The JSON names along the path.
    pub(crate) fn json(&self) -> &[String] {
        &self.json
    }

    /// The protobuf field numbers along the path.
    pub(crate) fn protobuf(&self) -> &[u32] {
        &self.protobuf
    }
}

/// Which declared field: its place in the codec's declarations
/// ([`CompactCodec::field_id`](super::CompactCodec::field_id)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldId(pub(crate) usize);

/// The fields pods are usually indexed by.
pub mod pod {
    use super::FieldPath;

    /// `spec.nodeName`: which node the pod runs on (PodSpec field 10).
    pub fn node_name() -> FieldPath {
        FieldPath::new("spec.nodeName", &[2, 10])
    }

    /// `status.phase`: Pending, Running, Succeeded, Failed (PodStatus field 1).
    pub fn phase() -> FieldPath {
        FieldPath::new("status.phase", &[3, 1])
    }

    /// `spec.serviceAccountName` (PodSpec field 8).
    pub fn service_account_name() -> FieldPath {
        FieldPath::new("spec.serviceAccountName", &[2, 8])
    }
}
