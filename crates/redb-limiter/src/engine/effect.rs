//! The effects: every change the engine makes to its state, as a value the store persists
//! without the engine knowing about redb, and whether the answer that made it waits for its
//! commit ([`Effect::needs_commit`]).
use std::sync::Arc;

use super::{
    BucketLevel, BucketMeta, Ceiling, CeilingChange, PermitId, PermitState, RequestRecord, TicketEnd, TicketId,
    TicketState,
};
use crate::time::Millis;

/// One change to the state, for the store to persist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The bucket's kept settings changed (or it was created).
    BucketMeta { bucket: Arc<str>, meta: BucketMeta },
    /// The total cost recorded in `bucket` at `at` is now `cost`.
    WindowGrant { bucket: Arc<str>, at: Millis, cost: u64 },
    /// These grants of `bucket` are gone (no request can count them any more).
    WindowPruned { bucket: Arc<str>, grants: Vec<Millis> },
    /// The bucket is idle (empty window, no places, no token level) and forgotten; `grants` are
    /// those of its grants still in the file.
    BucketForgotten { bucket: Arc<str>, grants: Vec<Millis> },
    /// A token bucket's level (section 13) is now `level`: created, granted from or settled.
    LevelSet { bucket: Arc<str>, level: BucketLevel },
    /// A token bucket stood full long enough and holds no places: its level is forgotten. May
    /// be lost in a crash (the level kept refills to full by the restart).
    LevelForgotten { bucket: Arc<str> },
    /// A permit was granted or settled: its record is now `permit`.
    PermitSet { id: PermitId, permit: PermitState },
    /// A permit is gone: released, or every one of its places lapsed.
    PermitEnded { id: PermitId },
    /// The caller is throttled until `until`.
    ThrottleSet { key: Arc<str>, until: Millis },
    /// The caller's throttle has passed.
    ThrottleEnded { key: Arc<str> },
    /// A ticket was filed (section 12.1); committed before the refusal that names it.
    TicketFiled { id: TicketId, ticket: TicketState },
    /// A ticket was asked again and refused (section 12.3), or its lapse moved after a restart:
    /// its new `retryAt`, lapse and grace. May be lost in a crash.
    TicketRenewed { id: TicketId, retry_at: Millis, lapse_at: Millis, grace_ms: u64 },
    /// A ticket ended: its request was granted, or its host left the line.
    TicketEnded { id: TicketId, end: TicketEnd },
    /// A ticket lapsed (section 12.4). May be lost in a crash.
    TicketLapsed { id: TicketId },
    /// A request id's record (section 16) is now `record`; committed before the answer it names.
    RequestKept { id: Arc<str>, record: RequestRecord },
    /// A request id's record (first kept at `since`) has lived its time. May be lost in a crash.
    RequestForgotten { id: Arc<str>, since: Millis },
    /// A bucket's adaptive ceiling (section 14) is now `ceiling`: an outcome counted (`change`
    /// says whether it cut or grew it; not persisted).
    CeilingSet { bucket: Arc<str>, ceiling: Ceiling, change: Option<CeilingChange> },
    /// A ceiling was forgotten with its bucket. May be lost in a crash (a restart forgets it
    /// again).
    CeilingForgotten { bucket: Arc<str> },
}

impl Effect {
    /// Whether the answer that made this effect waits for its commit. A renewal or a lapse may
    /// be lost in a crash (section 12.6): it rides with the next commit instead.
    #[must_use]
    pub fn needs_commit(&self) -> bool {
        !matches!(
            self,
            Effect::TicketRenewed { .. }
                | Effect::TicketLapsed { .. }
                | Effect::RequestForgotten { .. }
                | Effect::LevelForgotten { .. }
                | Effect::CeilingForgotten { .. }
        )
    }

    /// Whether this is a change of the line (a ticket's).
    #[must_use]
    pub fn is_line(&self) -> bool {
        matches!(
            self,
            Effect::TicketFiled { .. }
                | Effect::TicketRenewed { .. }
                | Effect::TicketEnded { .. }
                | Effect::TicketLapsed { .. }
        )
    }
}
