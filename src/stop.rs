//! Stop strings over streamed text: never lets out a piece of text that might still turn
//! into a stop string, and cuts the output right before the first stop string.

pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

/// What a push produced: text safe to print, and whether a stop string was found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed {
    pub emit: String,
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    pub fn push(&mut self, text: &str) -> Pushed {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return Pushed {
                emit: std::mem::take(&mut self.pending),
                stopped: false,
            };
        }
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let emit = self.pending[..at].to_string();
            self.pending.clear();
            return Pushed {
                emit,
                stopped: true,
            };
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let hold = (1..=self.pending.len())
            .rev()
            .filter(|&n| self.pending.is_char_boundary(self.pending.len() - n))
            .find(|&n| {
                let tail = &self.pending[self.pending.len() - n..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(0);
        let cut = self.pending.len() - hold;
        let emit = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        Pushed {
            emit,
            stopped: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn holds_back_partial_matches_and_cuts_before_the_stop() {
        let mut s = m(&["\n\nThe"]);
        assert_eq!(
            s.push(" Paris."),
            Pushed {
                emit: " Paris.".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("\n"),
            Pushed {
                emit: "".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("\n"),
            Pushed {
                emit: "".into(),
                stopped: false
            }
        );
        assert_eq!(
            s.push("The answer"),
            Pushed {
                emit: "".into(),
                stopped: true
            }
        );
    }

    #[test]
    fn releases_text_that_stops_looking_like_a_stop() {
        let mut s = m(&["STOP"]);
        assert_eq!(s.push("ST").emit, "");
        assert_eq!(
            s.push("AY"),
            Pushed {
                emit: "STAY".into(),
                stopped: false
            }
        );
        assert_eq!(s.push("xS").emit, "x");
    }

    #[test]
    fn earliest_of_several_stops_wins_and_multibyte_is_safe() {
        let mut s = m(&["bb", "ä"]);
        let p = s.push("aäbb");
        assert_eq!(
            p,
            Pushed {
                emit: "a".into(),
                stopped: true
            }
        );
        let mut s = m(&["日本"]);
        assert_eq!(s.push("東日").emit, "東");
        assert_eq!(s.push("x").emit, "日x");
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut s = m(&[]);
        assert_eq!(
            s.push("abc"),
            Pushed {
                emit: "abc".into(),
                stopped: false
            }
        );
    }
}
