//! The sharded engine: state split by key hash, concurrent consumers, no global lock on the
//! add/update/delete/pop path.
