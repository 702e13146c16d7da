//! LSMR (D. C.-L. Fong and M. A. Saunders, "LSMR: An iterative algorithm for sparse
//! least-squares problems", SIAM J. Sci. Comput. 33(5), 2011), with the stopping rules of
//! `scipy.sparse.linalg.lsmr`, which upstream's merge calls with `atol = btol = 1e-5`.
//!
//! Why not a crate's: upstream's solve stops far from convergence (on the fixture panorama
//! after 478 of the ~2100 iterations a tight tolerance takes, 0.5 % from the converged map), so
//! parity with it needs scipy's tests on scipy's own estimates of ‖r‖, ‖Aᵀr‖ and ‖A‖. faer's
//! LSMR stops on ‖Aᵀr‖ / ‖Aᵀb‖ only, and its callback cannot stop it.

use rayon::prelude::*;

/// A linear map and its transpose, as LSMR uses them.
pub trait Operator: Sync {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    /// `out = A x`.
    fn apply(&self, x: &[f64], out: &mut [f64]);
    /// `out = Aᵀ u`.
    fn apply_transpose(&self, u: &[f64], out: &mut [f64]);

    /// `y = k·A x − s·y`, and ‖y‖: the bidiagonalisation's step, one pass where the operator
    /// can fuse it (this default goes through [`Operator::apply`]).
    fn apply_sub(&self, x: &[f64], k: f64, s: f64, y: &mut [f64]) -> f64 {
        let mut ax = vec![0.0; y.len()];
        self.apply(x, &mut ax);
        combine(y, &ax, k, s)
    }

    /// `y = k·Aᵀ u − s·y`, and ‖y‖.
    fn apply_transpose_sub(&self, u: &[f64], k: f64, s: f64, y: &mut [f64]) -> f64 {
        let mut atu = vec![0.0; y.len()];
        self.apply_transpose(u, &mut atu);
        combine(y, &atu, k, s)
    }
}

/// scipy's stopping parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stop {
    pub atol: f64,
    pub btol: f64,
    pub conlim: f64,
    /// `None`: scipy's default, min(rows, cols).
    pub max_iterations: Option<usize>,
}

impl Stop {
    /// What upstream's `merge_panorama_depth` passes.
    pub const UPSTREAM: Stop = Stop { atol: 1e-5, btol: 1e-5, conlim: 1e8, max_iterations: None };
}

/// How a solve ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub iterations: usize,
    /// scipy's `istop`: 0 x = 0 solves it, 1 Ax − b small, 2 the least-squares test, 3-6 the
    /// condition or machine-precision tests, 7 the iteration limit.
    pub reason: u8,
    /// The estimate of ‖b − Ax‖.
    pub residual: f64,
}

/// Elements per parallel task. Sums are taken per task and then added in order, so a solve
/// gives the same bits on any number of threads.
const CHUNK: usize = 1 << 14;

/// Partial sums added in their order.
pub fn in_order(parts: Vec<f64>) -> f64 {
    parts.iter().sum()
}

fn norm(v: &[f64]) -> f64 {
    in_order(v.par_chunks(CHUNK).map(|c| c.iter().map(|x| x * x).sum()).collect()).sqrt()
}

/// `y = k·a − s·y`, and ‖y‖.
fn combine(y: &mut [f64], a: &[f64], k: f64, s: f64) -> f64 {
    let parts = y
        .par_chunks_mut(CHUNK)
        .zip(a.par_chunks(CHUNK))
        .map(|(y, a)| {
            let mut sum = 0.0;
            for (yi, &ai) in y.iter_mut().zip(a) {
                *yi = k * ai - s * *yi;
                sum += *yi * *yi;
            }
            sum
        })
        .collect();
    in_order(parts).sqrt()
}

/// A stable Givens rotation: (c, s, r) with [c s; −s c] [a; b] = [r; 0].
fn givens(a: f64, b: f64) -> (f64, f64, f64) {
    let sign = |v: f64| {
        if v > 0.0 {
            1.0
        } else if v < 0.0 {
            -1.0
        } else {
            0.0
        }
    };
    if b == 0.0 {
        (sign(a), 0.0, a.abs())
    } else if a == 0.0 {
        (0.0, sign(b), b.abs())
    } else if b.abs() > a.abs() {
        let t = a / b;
        let s = sign(b) / (1.0 + t * t).sqrt();
        (s * t, s, b / s)
    } else {
        let t = b / a;
        let c = sign(a) / (1.0 + t * t).sqrt();
        (c, c * t, a / c)
    }
}

/// Minimises ‖b − A x‖ from the start in `x`, which it overwrites with the solution.
pub fn lsmr(a: &impl Operator, b: &[f64], x: &mut [f64], stop: &Stop) -> Outcome {
    let (m, n) = (a.rows(), a.cols());
    assert_eq!((b.len(), x.len()), (m, n));
    let max_iterations = stop.max_iterations.unwrap_or(m.min(n));
    let normb = norm(b);
    // u and v are kept unnormalised, divided by their norms where they are read (û = u / u_div,
    // v̂ = v / v_div): a pass over each saved per iteration.
    let mut u = vec![0.0; m];
    a.apply(x, &mut u);
    let mut beta = combine(&mut u, b, 1.0, 1.0);
    let mut v = vec![0.0; n];
    let mut alpha = 0.0;
    let mut u_div = if beta > 0.0 { beta } else { 1.0 };
    if beta > 0.0 {
        alpha = a.apply_transpose_sub(&u, 1.0 / beta, 0.0, &mut v);
    }
    let mut v_div = if alpha > 0.0 { alpha } else { 1.0 };
    let mut zetabar = alpha * beta;
    let mut alphabar = alpha;
    let (mut rho, mut rhobar, mut cbar, mut sbar) = (1.0, 1.0, 1.0, 0.0);
    let mut h: Vec<f64> = v.iter().map(|&vi| vi / v_div).collect();
    let mut hbar = vec![0.0; n];
    // For the estimate of ‖r‖.
    let (mut betadd, mut betad, mut rhodold, mut tautildeold, mut thetatilde, mut zeta, mut d) = (beta, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0);
    // For the estimates of ‖A‖ and cond(A).
    let mut norm_a2 = alpha * alpha;
    let (mut maxrbar, mut minrbar) = (0.0f64, 1e100f64);
    let mut normr = beta;
    if alpha * beta == 0.0 {
        return Outcome { iterations: 0, reason: 0, residual: normr };
    }
    let mut it = 0;
    loop {
        it += 1;
        // The bidiagonalisation: β û' = A v̂ − α û, α' v̂' = Aᵀ û' − β v̂.
        beta = a.apply_sub(&v, 1.0 / v_div, alpha / u_div, &mut u);
        u_div = if beta > 0.0 { beta } else { 1.0 };
        if beta > 0.0 {
            alpha = a.apply_transpose_sub(&u, 1.0 / beta, beta / v_div, &mut v);
            v_div = if alpha > 0.0 { alpha } else { 1.0 };
        }
        // The rotations (no damping: the first is the identity up to sign).
        let (chat, shat, alphahat) = givens(alphabar, 0.0);
        let rhoold = rho;
        let (c, s, r) = givens(alphahat, beta);
        rho = r;
        let thetanew = s * alpha;
        alphabar = c * alpha;
        let rhobarold = rhobar;
        let zetaold = zeta;
        let thetabar = sbar * rho;
        let rhotemp = cbar * rho;
        let (cb, sb, rb) = givens(cbar * rho, thetanew);
        (cbar, sbar, rhobar) = (cb, sb, rb);
        zeta = cbar * zetabar;
        zetabar *= -sbar;
        // h̄, x and h.
        let hbar_scale = -(thetabar * rho / (rhoold * rhobarold));
        let x_step = zeta / (rho * rhobar);
        let h_scale = -(thetanew / rho);
        // One pass for the three, and ‖x‖ for the tests.
        let v_inv = 1.0 / v_div;
        let parts = hbar
            .par_chunks_mut(CHUNK)
            .zip(h.par_chunks_mut(CHUNK))
            .zip(x.par_chunks_mut(CHUNK))
            .zip(v.par_chunks(CHUNK))
            .map(|(((hbar, h), x), v)| {
                let mut sum = 0.0;
                for (((hb, hi), xi), &vi) in hbar.iter_mut().zip(h.iter_mut()).zip(x.iter_mut()).zip(v) {
                    *hb = *hb * hbar_scale + *hi;
                    *xi += x_step * *hb;
                    *hi = *hi * h_scale + vi * v_inv;
                    sum += *xi * *xi;
                }
                sum
            })
            .collect();
        let normx = in_order(parts).sqrt();
        // ‖r‖.
        let betaacute = chat * betadd;
        let betacheck = -shat * betadd;
        let betahat = c * betaacute;
        betadd = -s * betaacute;
        let thetatildeold = thetatilde;
        let (ctildeold, stildeold, rhotildeold) = givens(rhodold, thetabar);
        thetatilde = stildeold * rhobar;
        rhodold = ctildeold * rhobar;
        betad = -stildeold * betad + ctildeold * betahat;
        tautildeold = (zetaold - thetatildeold * tautildeold) / rhotildeold;
        let taud = (zeta - thetatilde * tautildeold) / rhodold;
        d += betacheck * betacheck;
        normr = (d + (betad - taud).powi(2) + betadd * betadd).sqrt();
        // ‖A‖ and cond(A).
        norm_a2 += beta * beta;
        let norm_a = norm_a2.sqrt();
        norm_a2 += alpha * alpha;
        maxrbar = maxrbar.max(rhobarold);
        if it > 1 {
            minrbar = minrbar.min(rhobarold);
        }
        let cond_a = maxrbar.max(rhotemp) / minrbar.min(rhotemp);
        // The tests, in scipy's order of precedence.
        let normar = zetabar.abs();
        let test1 = normr / normb;
        let test2 = if norm_a * normr != 0.0 { normar / (norm_a * normr) } else { f64::INFINITY };
        let test3 = 1.0 / cond_a;
        let t1 = test1 / (1.0 + norm_a * normx / normb);
        let rtol = stop.btol + stop.atol * norm_a * normx / normb;
        let reason = if test1 <= rtol {
            1
        } else if test2 <= stop.atol {
            2
        } else if test3 <= 1.0 / stop.conlim {
            3
        } else if 1.0 + t1 <= 1.0 {
            4
        } else if 1.0 + test2 <= 1.0 {
            5
        } else if 1.0 + test3 <= 1.0 {
            6
        } else if it >= max_iterations {
            7
        } else {
            0
        };
        if reason > 0 {
            return Outcome { iterations: it, reason, residual: normr };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small dense matrix as an operator.
    struct Dense {
        rows: usize,
        cols: usize,
        a: Vec<f64>,
    }

    impl Operator for Dense {
        fn rows(&self) -> usize {
            self.rows
        }
        fn cols(&self) -> usize {
            self.cols
        }
        fn apply(&self, x: &[f64], out: &mut [f64]) {
            for (i, o) in out.iter_mut().enumerate() {
                *o = (0..self.cols).map(|j| self.a[i * self.cols + j] * x[j]).sum();
            }
        }
        fn apply_transpose(&self, u: &[f64], out: &mut [f64]) {
            for (j, o) in out.iter_mut().enumerate() {
                *o = (0..self.rows).map(|i| self.a[i * self.cols + j] * u[i]).sum();
            }
        }
    }

    #[test]
    fn an_overdetermined_system_converges_to_its_normal_equations_solution() {
        // 4 x 2: the least-squares fit of a line through (0, 1), (1, 3), (2, 4), (3, 4).
        let a = Dense { rows: 4, cols: 2, a: vec![1.0, 0.0, 1.0, 1.0, 1.0, 2.0, 1.0, 3.0] };
        let b = [1.0, 3.0, 4.0, 4.0];
        let mut x = [0.0, 0.0];
        let tight = Stop { atol: 1e-12, btol: 1e-12, ..Stop::UPSTREAM };
        let out = lsmr(&a, &b, &mut x, &tight);
        // Normal equations: [4 6; 6 14] x = [12; 23] → x = (1.5, 1.0).
        assert!((x[0] - 1.5).abs() < 1e-10 && (x[1] - 1.0).abs() < 1e-10, "{x:?} {out:?}");
        // The residual estimate is the true one: b − Ax = (−0.5, 0.5, 0.5, −0.5).
        assert!((out.residual - 1.0).abs() < 1e-9, "{out:?}");
        // A start already at the answer stops at once on the least-squares test.
        let again = lsmr(&a, &b, &mut x, &Stop::UPSTREAM);
        assert!(again.iterations <= 1 && again.reason > 0, "{again:?}");
    }

    #[test]
    fn a_rank_deficient_system_keeps_the_starts_null_space_component() {
        // x0 − x1 = 1 fixes only the difference: from (5, 5) LSMR moves within the row space.
        let a = Dense { rows: 1, cols: 2, a: vec![1.0, -1.0] };
        let mut x = [5.0, 5.0];
        lsmr(&a, &[1.0], &mut x, &Stop { atol: 1e-12, btol: 1e-12, ..Stop::UPSTREAM });
        assert!((x[0] - 5.5).abs() < 1e-12 && (x[1] - 4.5).abs() < 1e-12, "{x:?}");
    }
}
