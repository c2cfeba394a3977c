//! [`CompactCodec`]: lists and watch events into [`CompactObject`]s, from protobuf or JSON.

use std::sync::Arc;

use super::super::super::lister_watcher::{Error, Page, Versioned, WatchEvent};
use super::super::codec::{
    protobuf_list, protobuf_status, unwrap_object, watch_event, Codec, Format, JsonBookmark,
    JsonStatus, ResourcePath, JSON,
};
use super::fields::{FieldId, FieldPath};
use super::json;
use super::layout::{with_builder, Builder};
use super::protobuf::Plan;
use super::CompactObject;

/// Decodes a resource into [`CompactObject`]s, whichever format the server answers with.
///
/// [`CompactCodec::protobuf`] asks as client-go does for built-in types (protobuf first, JSON
/// accepted); [`CompactCodec::json_only`] asks for JSON (custom resources). Either way the
/// object is kept in the format it arrived in. What a cache reads is decoded once; the rest is
/// kept as bytes.
#[derive(Debug, Clone)]
pub struct CompactCodec {
    resource: Arc<ResourcePath>,
    protobuf: bool,
    options: Arc<Options>,
}

#[derive(Debug, Clone, Default)]
struct Options {
    keep_managed_fields: bool,
    fields: Vec<FieldPath>,
}

impl CompactCodec {
    /// The built-in type `T` (a `k8s-pb` message: its group, version and plural), asking for
    /// protobuf first.
    pub fn protobuf<T: k8s_pb::Resource>() -> Self {
        Self::new(T::GROUP, T::VERSION, T::URL_PATH_SEGMENT, true)
    }

    /// The resource `group`/`version`/`plural` (`""` for the core group), asking for JSON only
    /// (custom resources, and servers without protobuf).
    pub fn json_only(group: &str, version: &str, plural: &str) -> Self {
        Self::new(group, version, plural, false)
    }

    fn new(group: &str, version: &str, plural: &str, protobuf: bool) -> Self {
        Self {
            resource: Arc::new(ResourcePath {
                group: group.to_owned(),
                version: version.to_owned(),
                plural: plural.to_owned(),
            }),
            protobuf,
            options: Arc::default(),
        }
    }

    /// Keeps `metadata.managedFields` (stripped by default: they are about half of a typical
    /// object's bytes and no controller reads them from its cache).
    pub fn keep_managed_fields(mut self, keep: bool) -> Self {
        Arc::make_mut(&mut self.options).keep_managed_fields = keep;
        self
    }

    /// Decodes `field` too, for index functions ([`super::index_by_field`]).
    ///
    /// # Panics
    ///
    /// Past 64 declared fields.
    pub fn index_field(mut self, field: FieldPath) -> Self {
        let options = Arc::make_mut(&mut self.options);
        assert!(options.fields.len() < 64, "at most 64 declared fields");
        options.fields.push(field);
        self
    }

    /// The id of the declared field named `name` (its JSON path), for
    /// [`CompactObject::field`].
    pub fn field_id(&self, name: &str) -> Option<FieldId> {
        self.options
            .fields
            .iter()
            .position(|f| f.name() == name)
            .map(FieldId)
    }

    fn plan(&self) -> Plan<'_> {
        Plan {
            keep_managed_fields: self.options.keep_managed_fields,
            fields: &self.options.fields,
            resource_version: None,
        }
    }

    fn fields(&self) -> usize {
        self.options.fields.len()
    }

    /// One object's body (protobuf: the object's own message, inside its envelope or not;
    /// JSON: the object) as a compact object.
    pub fn object(&self, format: Format, body: &[u8]) -> Result<CompactObject, Error> {
        let body = match format {
            Format::Protobuf if body.starts_with(super::super::codec::MAGIC) => {
                unwrap_object(body)?.raw
            }
            _ => body,
        };
        CompactObject::build(format, body, self.fields(), self.plan())
    }

    fn finish(b: &mut Builder, format: Format) -> Result<Arc<CompactObject>, Error> {
        let finished = b.finish()?;
        Ok(Arc::new(CompactObject::from_finished(format, finished)))
    }

    fn protobuf_event(&self, frame: &[u8]) -> Result<WatchEvent<CompactObject>, Error> {
        let (event_type, raw) = watch_event(frame)?;
        let object = unwrap_object(raw)?;
        if event_type == "ERROR" {
            return Ok(WatchEvent::Error(protobuf_status(object.raw)?));
        }
        let built = Arc::new(CompactObject::build(
            Format::Protobuf,
            object.raw,
            self.fields(),
            self.plan(),
        )?);
        event_of(event_type, built)
    }

    fn json_event(&self, frame: &[u8]) -> Result<WatchEvent<CompactObject>, Error> {
        let text = std::str::from_utf8(frame)
            .map_err(|e| Error::Decode(format!("a watch event is not UTF-8: {e}")))?;
        with_builder(self.fields(), |b| {
            let event = json::event(b, text, self.plan())?;
            let Some(raw) = event.raw_object else {
                return event_of(&event.kind, Self::finish(b, Format::Json)?);
            };
            let decode = |what: &str, e: serde_json::Error| {
                Error::Decode(format!("{what} is not valid JSON: {e}"))
            };
            match &*event.kind {
                "BOOKMARK" => {
                    let bookmark: JsonBookmark =
                        serde_json::from_str(raw).map_err(|e| decode("a bookmark", e))?;
                    Ok(WatchEvent::Bookmark {
                        resource_version: bookmark.metadata.resource_version,
                    })
                }
                "ERROR" => {
                    let status: JsonStatus =
                        serde_json::from_str(raw).map_err(|e| decode("a status", e))?;
                    Ok(WatchEvent::Error(status.into()))
                }
                // The object came before its type: write it now.
                kind => {
                    b.reset(self.fields());
                    json::build(b, raw, self.plan())?;
                    event_of(kind, Self::finish(b, Format::Json)?)
                }
            }
        })
    }

    fn protobuf_list(&self, body: &[u8]) -> Result<Page<CompactObject>, Error> {
        protobuf_list(body, |item| {
            CompactObject::build(Format::Protobuf, item, self.fields(), self.plan()).map(Arc::new)
        })
    }

    fn json_list(&self, body: &[u8]) -> Result<Page<CompactObject>, Error> {
        let text = std::str::from_utf8(body)
            .map_err(|e| Error::Decode(format!("a list is not UTF-8: {e}")))?;
        let mut items = Vec::new();
        let meta = with_builder(self.fields(), |b| {
            json::list(b, self.fields(), text, self.plan(), &mut |b| {
                items.push(Self::finish(b, Format::Json)?);
                Ok(())
            })
        })?;
        Ok(Page {
            items,
            resource_version: meta.resource_version.unwrap_or_default(),
            continue_token: meta.continue_token.filter(|c| !c.is_empty()),
        })
    }
}

/// The event of type `kind` carrying `object`.
fn event_of(kind: &str, object: Arc<CompactObject>) -> Result<WatchEvent<CompactObject>, Error> {
    Ok(match kind {
        "ADDED" => WatchEvent::Added(object),
        "MODIFIED" => WatchEvent::Modified(object),
        "DELETED" => WatchEvent::Deleted(object),
        "BOOKMARK" => WatchEvent::Bookmark {
            resource_version: object.resource_version().to_owned(),
        },
        other => {
            return Err(Error::Decode(format!(
                "a watch event of unknown type {other:?}"
            )))
        }
    })
}

impl Codec for CompactCodec {
    type Object = CompactObject;

    fn accept(&self) -> &'static str {
        if self.protobuf {
            "application/vnd.kubernetes.protobuf, application/json"
        } else {
            JSON
        }
    }

    fn watch_accept(&self) -> &'static str {
        if self.protobuf {
            "application/vnd.kubernetes.protobuf;stream=watch, application/json"
        } else {
            JSON
        }
    }

    fn resource(&self) -> ResourcePath {
        (*self.resource).clone()
    }

    fn list(&self, format: Format, body: &[u8]) -> Result<Page<CompactObject>, Error> {
        match format {
            Format::Protobuf => self.protobuf_list(body),
            Format::Json => self.json_list(body),
        }
    }

    fn event(&self, format: Format, frame: &[u8]) -> Result<WatchEvent<CompactObject>, Error> {
        match format {
            Format::Protobuf => self.protobuf_event(frame),
            Format::Json => self.json_event(frame),
        }
    }
}
