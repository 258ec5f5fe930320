package ratelimit

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

// Limits and defaults of the JWKS fetcher.
const (
	// jwksDefaultRefresh is how often the key set is fetched again when
	// jwks_refresh is not set.
	jwksDefaultRefresh = 5 * time.Minute
	// jwksMinRefresh and jwksMaxRefresh bound jwks_refresh: often enough to
	// follow a rotation, rarely enough not to hammer the identity provider.
	jwksMinRefresh = time.Minute
	jwksMaxRefresh = 24 * time.Hour
	// jwksMissInterval is the least time between two refetches triggered by
	// a token whose kid is not in the set, so a flood of made-up kids costs
	// the identity provider one request a minute.
	jwksMissInterval = time.Minute
	// jwksRetryMin is the first delay before retrying a failed fetch; it
	// doubles up to the refresh interval.
	jwksRetryMin = 5 * time.Second
	// jwksTimeout bounds one fetch, connection and body included.
	jwksTimeout = 10 * time.Second
	// jwksMaxBody bounds the response body; real key sets are a few KiB.
	jwksMaxBody = 1 << 20
	// jwksMaxKeys bounds how many keys of one set are kept.
	jwksMaxKeys = 100
	// jwtMaxKidlessCandidates bounds how many keys a token without a kid is
	// tried against, so one such token costs a bounded number of signature
	// checks.
	jwtMaxKidlessCandidates = 8
)

// Algorithms each key type may verify. HMAC is only ever accepted for a
// configured secret, never for a public key.
var (
	jwtHMACAlgs    = []string{"HS256", "HS384", "HS512"}
	jwtRSAAlgs     = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	jwtEdDSAAlgs   = []string{"EdDSA"}
	jwtAsymmetric  = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
	jwtCurveAlgs   = map[int][]string{256: {"ES256"}, 384: {"ES384"}, 521: {"ES512"}}
	jwkCurvesByCrv = map[string]elliptic.Curve{"P-256": elliptic.P256(), "P-384": elliptic.P384(), "P-521": elliptic.P521()}
)

// jwtKey is one verification key and the algorithms it may verify.
type jwtKey struct {
	kid string
	// key is []byte (HMAC secret), *rsa.PublicKey, *ecdsa.PublicKey or
	// ed25519.PublicKey.
	key  any
	algs []string
}

// accepts reports whether m may be verified with k: the algorithm is one
// pinned to the key, and the method's Go type matches the key's type (so an
// HS256 token can never be checked against a public key used as an HMAC
// secret, and an ES256 token never against a P-384 key).
func (k *jwtKey) accepts(m jwt.SigningMethod) bool {
	if m == nil || !slices.Contains(k.algs, m.Alg()) {
		return false
	}
	switch key := k.key.(type) {
	case []byte:
		_, ok := m.(*jwt.SigningMethodHMAC)
		return ok
	case *rsa.PublicKey:
		switch m.(type) {
		case *jwt.SigningMethodRSA, *jwt.SigningMethodRSAPSS:
			return true
		}
		return false
	case *ecdsa.PublicKey:
		em, ok := m.(*jwt.SigningMethodECDSA)
		return ok && key.Curve != nil && key.Curve.Params().BitSize == em.CurveBits
	case ed25519.PublicKey:
		_, ok := m.(*jwt.SigningMethodEd25519)
		return ok
	}
	return false
}

// jwtPublicKeyAlgs returns the algorithms a public key may verify.
func jwtPublicKeyAlgs(key any) ([]string, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		return jwtRSAAlgs, nil
	case *ecdsa.PublicKey:
		if k.Curve == nil {
			return nil, errors.New("ECDSA key without a curve")
		}
		algs, ok := jwtCurveAlgs[k.Curve.Params().BitSize]
		if !ok {
			return nil, fmt.Errorf("unsupported ECDSA curve %s", k.Curve.Params().Name)
		}
		return algs, nil
	case ed25519.PublicKey:
		return jwtEdDSAAlgs, nil
	}
	return nil, fmt.Errorf("unsupported public key type %T (want RSA, ECDSA or Ed25519)", key)
}

// jwtKeySet is an immutable set of verification keys. A new set replaces the
// old one atomically, so requests never wait for a fetch.
type jwtKeySet struct {
	keys  []*jwtKey
	byKid map[string][]*jwtKey
	// ignoreKid is set for keys from the configuration (secret, public_key):
	// there is only one key, whatever kid the token names.
	ignoreKid bool
	// gen changes whenever the content of the set changes; cached results
	// carry the generation they were computed under and die with it.
	gen uint64
}

func newJWTKeySet(keys []*jwtKey, ignoreKid bool, gen uint64) *jwtKeySet {
	s := &jwtKeySet{keys: keys, ignoreKid: ignoreKid, gen: gen, byKid: make(map[string][]*jwtKey, len(keys))}
	for _, k := range keys {
		s.byKid[k.kid] = append(s.byKid[k.kid], k)
	}
	return s
}

// find returns the key (or a jwt.VerificationKeySet of keys) that may verify
// a token signed with m under kid. miss reports that the token names a key
// the set does not hold (or the set is empty), which is worth a refetch.
func (s *jwtKeySet) find(kid string, hasKid bool, m jwt.SigningMethod) (key any, miss bool, err error) {
	if len(s.keys) == 0 {
		return nil, true, errors.New("no verification keys loaded")
	}
	candidates := s.keys
	if hasKid && !s.ignoreKid {
		var ok bool
		if candidates, ok = s.byKid[kid]; !ok {
			if len(kid) > 64 {
				kid = kid[:64] + "..."
			}
			return nil, true, fmt.Errorf("no key with kid %q", kid)
		}
	}
	var usable []jwt.VerificationKey
	for _, k := range candidates {
		if k.accepts(m) {
			usable = append(usable, k.key)
			if len(usable) == jwtMaxKidlessCandidates {
				break
			}
		}
	}
	switch len(usable) {
	case 0:
		return nil, false, fmt.Errorf("no key accepts algorithm %s", m.Alg())
	case 1:
		return usable[0], false, nil
	}
	return jwt.VerificationKeySet{Keys: usable}, false, nil
}

// jsonWebKey holds the JWK members (RFC 7517, 7518, 8037) this fetcher reads.
type jsonWebKey struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	Crv string `json:"crv"`
	N   string `json:"n"`
	E   string `json:"e"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// parseJWKS decodes a JWK Set document. Keys that cannot be used for
// signature verification (encryption keys, symmetric keys, unknown types,
// malformed members) are skipped and reported in skipped; the set is an
// error only if it is not JSON or holds no usable key.
func parseJWKS(body []byte) (keys []*jwtKey, skipped []error, err error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, nil, fmt.Errorf("decoding JWK set: %w", err)
	}
	for i, raw := range doc.Keys {
		if len(keys) == jwksMaxKeys {
			skipped = append(skipped, fmt.Errorf("keys after the first %d ignored", jwksMaxKeys))
			break
		}
		var jwk jsonWebKey
		if err := json.Unmarshal(raw, &jwk); err != nil {
			skipped = append(skipped, fmt.Errorf("key %d: %w", i, err))
			continue
		}
		k, err := jwk.verificationKey()
		if err != nil {
			skipped = append(skipped, fmt.Errorf("key %d (kid %q): %w", i, jwk.Kid, err))
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, skipped, errors.New("JWK set holds no usable signature key")
	}
	return keys, skipped, nil
}

// verificationKey converts a JWK into a public key pinned to the algorithms
// its type allows (narrowed to its "alg" member when present).
func (j *jsonWebKey) verificationKey() (*jwtKey, error) {
	if j.Use != "" && j.Use != "sig" {
		return nil, fmt.Errorf("use %q is not a signature key", j.Use)
	}
	var (
		key  any
		algs []string
	)
	switch j.Kty {
	case "RSA":
		n, err := jwkInt(j.N, "n")
		if err != nil {
			return nil, err
		}
		e, err := jwkInt(j.E, "e")
		if err != nil {
			return nil, err
		}
		if bits := n.BitLen(); bits < 1024 || bits > 8192 {
			return nil, fmt.Errorf("RSA modulus of %d bits outside 1024..8192", bits)
		}
		if !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 || e.Bit(0) == 0 {
			return nil, errors.New("RSA exponent out of range")
		}
		key, algs = &rsa.PublicKey{N: n, E: int(e.Int64())}, jwtRSAAlgs
	case "EC":
		curve, ok := jwkCurvesByCrv[j.Crv]
		if !ok {
			return nil, fmt.Errorf("unsupported EC curve %q", j.Crv)
		}
		size := (curve.Params().BitSize + 7) / 8
		x, err := jwkCoordinate(j.X, "x", size)
		if err != nil {
			return nil, err
		}
		y, err := jwkCoordinate(j.Y, "y", size)
		if err != nil {
			return nil, err
		}
		point := make([]byte, 0, 1+2*size)
		point = append(append(append(point, 4), x...), y...)
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, point)
		if err != nil {
			return nil, fmt.Errorf("EC point: %w", err)
		}
		key, algs = pub, jwtCurveAlgs[curve.Params().BitSize]
	case "OKP":
		if j.Crv != "Ed25519" {
			return nil, fmt.Errorf("unsupported OKP curve %q", j.Crv)
		}
		x, err := jwkBytes(j.X, "x")
		if err != nil {
			return nil, err
		}
		if len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("Ed25519 key of %d bytes", len(x))
		}
		key, algs = ed25519.PublicKey(x), jwtEdDSAAlgs
	default:
		return nil, fmt.Errorf("unsupported key type %q", j.Kty)
	}
	if j.Alg != "" {
		if !slices.Contains(algs, j.Alg) {
			return nil, fmt.Errorf("alg %q does not fit a %s key", j.Alg, j.Kty)
		}
		algs = []string{j.Alg}
	}
	return &jwtKey{kid: j.Kid, key: key, algs: algs}, nil
}

// jwkBytes decodes a base64url member, tolerating padding some encoders add.
func jwkBytes(s, name string) ([]byte, error) {
	if s == "" {
		return nil, fmt.Errorf("member %q missing", name)
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
	if err != nil {
		return nil, fmt.Errorf("member %q: %w", name, err)
	}
	return b, nil
}

func jwkInt(s, name string) (*big.Int, error) {
	b, err := jwkBytes(s, name)
	if err != nil {
		return nil, err
	}
	return new(big.Int).SetBytes(b), nil
}

// jwkCoordinate decodes an EC coordinate to exactly size bytes; RFC 7518
// requires full length, but shorter encodings that dropped leading zeros
// are padded rather than refused.
func jwkCoordinate(s, name string, size int) ([]byte, error) {
	b, err := jwkBytes(s, name)
	if err != nil {
		return nil, err
	}
	if len(b) > size {
		return nil, fmt.Errorf("member %q is %d bytes, want %d", name, len(b), size)
	}
	if len(b) < size {
		b = append(make([]byte, size-len(b)), b...)
	}
	return b, nil
}

// jwksSource keeps the key set of a JWKS URL current: fetched once at
// provision, again every refresh interval, and on demand (at most once per
// missInterval) when a token names a kid the set does not hold. Requests
// only ever load the current set atomically; fetching happens in its own
// goroutine.
type jwksSource struct {
	url          string
	client       *http.Client
	logger       *zap.Logger
	refresh      time.Duration
	missInterval time.Duration
	retryMin     time.Duration
	now          func() time.Time

	set      atomic.Pointer[jwtKeySet]
	lastMiss atomic.Int64 // UnixNano of the last refetch a kid miss asked for
	kick     chan struct{}
	fetches  atomic.Int64 // completed fetch attempts, for tests and logs

	// lastBody is the digest of the last document fetched; only the
	// fetching goroutine (or provision, before it starts) touches it.
	lastBody [sha256.Size]byte

	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once
}

// current returns the key set in use; never nil.
func (s *jwksSource) current() *jwtKeySet { return s.set.Load() }

// fetch downloads and installs the key set. On any failure the previous set
// stays in use.
func (s *jwksSource) fetch(ctx context.Context) error {
	defer s.fetches.Add(1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return fmt.Errorf("fetching JWKS %s: %w", s.url, err)
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("fetching JWKS %s: %w", s.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetching JWKS %s: status %s", s.url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, jwksMaxBody+1))
	if err != nil {
		return fmt.Errorf("reading JWKS %s: %w", s.url, err)
	}
	if len(body) > jwksMaxBody {
		return fmt.Errorf("reading JWKS %s: body larger than %d bytes", s.url, jwksMaxBody)
	}
	digest := sha256.Sum256(body)
	if digest == s.lastBody && len(s.current().keys) > 0 {
		return nil // unchanged: keep the generation, so cached tokens survive
	}
	keys, skipped, err := parseJWKS(body)
	for _, e := range skipped {
		s.logger.Warn("JWKS key skipped", zap.String("jwks_url", s.url), zap.Error(e))
	}
	if err != nil {
		return fmt.Errorf("parsing JWKS %s: %w", s.url, err)
	}
	s.lastBody = digest
	s.set.Store(newJWTKeySet(keys, false, s.current().gen+1))
	s.logger.Debug("JWKS loaded", zap.String("jwks_url", s.url), zap.Int("keys", len(keys)))
	return nil
}

// requestRefetch asks the background goroutine for a fetch because a token
// named an unknown kid. It never blocks, and asks at most once per
// missInterval.
func (s *jwksSource) requestRefetch() {
	now := s.now().UnixNano()
	last := s.lastMiss.Load()
	if last != 0 && now-last < int64(s.missInterval) {
		return
	}
	if !s.lastMiss.CompareAndSwap(last, now) {
		return
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// start launches the refresh goroutine; ok tells whether the first fetch
// succeeded (if not, it retries sooner than the refresh interval).
func (s *jwksSource) start(parent context.Context, ok bool) {
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	s.done = make(chan struct{})
	go s.run(ctx, ok)
}

func (s *jwksSource) run(ctx context.Context, ok bool) {
	defer close(s.done)
	retry := s.retryMin
	next := func(ok bool) time.Duration {
		if ok {
			retry = s.retryMin
			return s.refresh
		}
		wait := min(retry, s.refresh)
		retry = min(2*retry, s.refresh)
		return wait
	}
	timer := time.NewTimer(next(ok))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.kick:
		}
		err := s.fetch(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.logger.Error("JWKS refresh failed; keeping the previous keys", zap.Error(err))
		}
		timer.Reset(next(err == nil))
	}
}

// close stops the refresh goroutine and waits for it; safe to call twice.
func (s *jwksSource) close() {
	s.closeOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
			<-s.done
		}
	})
}
