//! client-go's `util/workqueue`: a deduplicating queue of items with delayed and rate-limited
//! adds, every time-dependent part reading one injectable [`Clock`].

mod clock;
mod limiter;

pub use clock::{Clock, ClockError, FakeClock, RealClock, Subscription, Time};
pub use limiter::{
    default_controller_rate_limiter, BucketRateLimiter, ExponentialFailureRateLimiter,
    FastSlowRateLimiter, MaxOfRateLimiter, RateLimiter,
};
