package api

import (
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vibemon/vmon/internal/errdefs"
)

func TestParseMetadataQuery(t *testing.T) {
	for _, tc := range []struct {
		name string
		// query is the raw query string, as the SDK sends it.
		query string
		want  map[string]string
		bad   string
	}{
		{name: "captured SDK example", query: "metadata=a%252520b%3Dc%252526d", want: map[string]string{"a b": "c&d"}},
		{name: "two pairs", query: "metadata=" + url.QueryEscape("team=x&app=y"), want: map[string]string{"team": "x", "app": "y"}},
		{name: "equals in value", query: "metadata=" + url.QueryEscape(url.QueryEscape("k")+"="+url.QueryEscape("a=b")), want: map[string]string{"k": "a=b"}},
		{name: "unicode", query: "metadata=" + url.QueryEscape(url.QueryEscape("ключ")+"="+url.QueryEscape("значение")), want: map[string]string{"ключ": "значение"}},
		{name: "empty value", query: "metadata=" + url.QueryEscape("k="), want: map[string]string{"k": ""}},
		{name: "absent", query: "", want: nil},
		{name: "no equals", query: "metadata=" + url.QueryEscape("abc"), bad: "expected key=value"},
		{name: "bad escape", query: "metadata=%2525zz%3Dx", bad: "invalid metadata filter key encoding"},
		{name: "bad outer escape", query: "metadata=%25zz", bad: "invalid metadata filter encoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parseMetadataQuery(q.Get("metadata"))
			if tc.bad != "" {
				if !errdefs.Is(err, errdefs.KindInvalidArgument) || !strings.Contains(errdefs.PublicMessage(err), tc.bad) {
					t.Fatalf("err = %v, want InvalidArgument %q", err, tc.bad)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestListV2(t *testing.T) {
	e := newEnv(t, envOpts{})
	target := e.create(t, `{"templateID":"base","metadata":{"a b":"c&d","n":"0"}}`)["sandboxID"].(string)
	var ids []string
	for i := 1; i <= 4; i++ {
		e.clock.Advance(time.Second)
		ids = append(ids, e.create(t, `{"templateID":"base","metadata":{"n":"`+strconv.Itoa(i)+`"}}`)["sandboxID"].(string))
	}
	killed := e.create(t, `{"templateID":"base"}`)["sandboxID"].(string)
	if w := e.do("DELETE", "/sandboxes/"+killed, ""); w.Code != 204 {
		t.Fatal(w.Code)
	}

	// The captured SDK encoding of {"a b":"c&d"}.
	w := e.do("GET", "/v2/sandboxes?metadata=a%252520b%3Dc%252526d", "")
	got := decodeList(t, w)
	if w.Code != 200 || len(got) != 1 || got[0]["sandboxID"] != target {
		t.Fatalf("metadata filter: %d %s", w.Code, w.Body)
	}
	if got[0]["state"] != "running" || got[0]["clientID"] != ClientID || got[0]["alias"] != "base" ||
		got[0]["envdVersion"] != "0.6.13" || got[0]["cpuCount"] != 2.0 || got[0]["metadata"].(map[string]any)["a b"] != "c&d" {
		t.Fatalf("listed sandbox = %v", got[0])
	}
	if w.Header().Get("X-Total-Running") != "5" || w.Header().Get("X-Next-Token") != "" {
		t.Fatalf("headers: %v", w.Header())
	}

	// Paging newest first, 2 per page, with a create between pages that must not disturb it.
	var seen []string
	token := ""
	for page := 0; ; page++ {
		q := "/v2/sandboxes?limit=2&state=running,paused"
		if token != "" {
			q += "&nextToken=" + url.QueryEscape(token)
		}
		w := e.do("GET", q, "")
		if w.Code != 200 {
			t.Fatalf("page %d: %d %s", page, w.Code, w.Body)
		}
		for _, sb := range decodeList(t, w) {
			seen = append(seen, sb["sandboxID"].(string))
		}
		if page == 0 {
			e.create(t, `{"templateID":"base"}`)
		}
		if token = w.Header().Get("X-Next-Token"); token == "" {
			break
		}
	}
	want := []string{ids[3], ids[2], ids[1], ids[0], target}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("pages = %v, want %v", seen, want)
	}

	asc := decodeList(t, e.do("GET", "/v2/sandboxes?order=asc&limit=2&template=base", ""))
	if len(asc) != 2 || asc[0]["sandboxID"] != target || asc[1]["sandboxID"] != ids[0] {
		t.Fatalf("asc = %v", asc)
	}
	after := decodeList(t, e.do("GET", "/v2/sandboxes?order=asc&startedAfter=2025-06-01T12:00:03.500Z", ""))
	// ids[3] and the sandbox created while paging share the last start time.
	if len(after) != 2 || (after[0]["sandboxID"] != ids[3] && after[1]["sandboxID"] != ids[3]) {
		t.Fatalf("startedAfter = %v", after)
	}
	if got := decodeList(t, e.do("GET", "/v2/sandboxes?state=paused", "")); len(got) != 0 {
		t.Fatalf("paused = %v", got)
	}
	if got := decodeList(t, e.do("GET", "/v2/sandboxes?state=running&state=paused&template=nope", "")); len(got) != 0 {
		t.Fatalf("unknown template = %v", got)
	}

	for _, c := range []struct{ query, msg string }{
		{"state=killed", `invalid state "killed"`},
		{"state=running,bogus", `invalid state "bogus"`},
		{"limit=0", "limit must be an integer between 1 and 100"},
		{"limit=101", "limit must be an integer between 1 and 100"},
		{"limit=ten", "limit must be an integer"},
		{"order=sideways", "order must be asc or desc"},
		{"startedAfter=yesterday", "startedAfter must be an RFC 3339 time"},
		{"nextToken=garbage!", "invalid nextToken"},
		{"metadata=nokey", "expected key=value"},
	} {
		wantError(t, e.do("GET", "/v2/sandboxes?"+c.query, ""), 400, c.msg)
	}
}

func TestListV1(t *testing.T) {
	e := newEnv(t, envOpts{})
	a := e.create(t, `{"templateID":"base","metadata":{"team":"x"}}`)["sandboxID"].(string)
	e.clock.Advance(time.Second)
	b := e.create(t, `{"templateID":"base","metadata":{"team":"y"}}`)["sandboxID"].(string)
	killed := e.create(t, `{"templateID":"base","metadata":{"team":"x"}}`)["sandboxID"].(string)
	e.do("DELETE", "/sandboxes/"+killed, "")

	all := decodeList(t, e.do("GET", "/sandboxes", ""))
	if len(all) != 2 || all[0]["sandboxID"] != b || all[1]["sandboxID"] != a {
		t.Fatalf("v1 list = %v", all)
	}
	x := decodeList(t, e.do("GET", "/sandboxes?metadata="+url.QueryEscape("team=x"), ""))
	if len(x) != 1 || x[0]["sandboxID"] != a {
		t.Fatalf("v1 metadata = %v", x)
	}
	// An empty list is [] (not null): the SDK iterates it.
	e.do("DELETE", "/sandboxes/"+a, "")
	e.do("DELETE", "/sandboxes/"+b, "")
	if w := e.do("GET", "/sandboxes", ""); w.Body.String() != "[]\n" {
		t.Fatalf("empty v1 list = %q", w.Body)
	}
	if w := e.do("GET", "/v2/sandboxes", ""); w.Body.String() != "[]\n" || w.Header().Get("X-Total-Running") != "0" {
		t.Fatalf("empty v2 list = %q", w.Body)
	}
}
