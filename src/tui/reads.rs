//! Which reads are under way. One read of each kind at a time (one series read per run): a slow
//! store is not asked again while it answers. A read asked for meanwhile is not dropped but held,
//! and asked again once the one under way has answered: it may have been asked for because of
//! something that read cannot have seen (a run that just ended must be read to its last step; a
//! dashboard reopened needs its own whole read).

use super::app::Effect;

#[derive(Debug, Default)]
pub struct Reads {
    in_flight: Vec<Effect>,
    /// At most one per kind, the latest asked for.
    held: Vec<Effect>,
}

impl Reads {
    /// Whether `effect` (a read) can go now; if not, it is held until the same read answers.
    pub fn admit(&mut self, effect: &Effect) -> bool {
        if !self.in_flight.iter().any(|e| e.same_read(effect)) {
            self.in_flight.push(effect.clone());
            return true;
        }
        self.held.retain(|e| !e.same_read(effect));
        self.held.push(effect.clone());
        false
    }

    /// The read `done` answered; the read held for after it, if any.
    pub fn answered(&mut self, done: &Effect) -> Option<Effect> {
        self.in_flight.retain(|e| !e.same_read(done));
        let at = self.held.iter().position(|e| e.same_read(done))?;
        Some(self.held.remove(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunId;

    #[test]
    fn a_read_asked_while_the_same_is_under_way_is_held_until_it_answers() {
        let mut reads = Reads::default();
        let poll = Effect::LoadEvents {
            run: RunId(1),
            after: Some(4),
        };
        let whole = Effect::LoadEvents {
            run: RunId(1),
            after: None,
        };
        assert!(reads.admit(&poll));
        assert!(reads.admit(&Effect::LoadRuns), "another kind goes at once");
        assert!(!reads.admit(&poll));
        assert!(!reads.admit(&whole), "the latest held replaces the earlier");
        assert_eq!(reads.answered(&Effect::LoadRuns), None);
        assert_eq!(reads.answered(&poll), Some(whole.clone()));
        assert_eq!(reads.answered(&poll), None);
        assert!(reads.admit(&whole), "nothing under way any more");
    }
}
