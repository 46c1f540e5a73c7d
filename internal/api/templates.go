package api

import (
	"net/http"
	"time"

	"github.com/vibemon/vmon/internal/store"
)

// templateJSON is E2B's `Template` (list).
type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
}

// templateWithBuildsJSON is E2B's `TemplateWithBuilds` (GET one).
type templateWithBuildsJSON struct {
	TemplateID    string              `json:"templateID"`
	Public        bool                `json:"public"`
	Aliases       []string            `json:"aliases"`
	Names         []string            `json:"names"`
	CreatedAt     time.Time           `json:"createdAt"`
	UpdatedAt     time.Time           `json:"updatedAt"`
	LastSpawnedAt *time.Time          `json:"lastSpawnedAt"`
	SpawnCount    int64               `json:"spawnCount"`
	Builds        []templateBuildJSON `json:"builds"`
}

type templateBuildJSON struct {
	BuildID     string     `json:"buildID"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"createdAt"`
	UpdatedAt   time.Time  `json:"updatedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	CPUCount    int        `json:"cpuCount"`
	MemoryMB    int        `json:"memoryMB"`
	DiskSizeMB  int        `json:"diskSizeMB"`
	EnvdVersion string     `json:"envdVersion"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func buildCount(t store.Template) int {
	if t.BuildID == "" {
		return 0
	}
	return 1
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	tpls, err := s.store.ListTemplates(r.Context())
	if err != nil {
		return err
	}
	out := make([]templateJSON, 0, len(tpls))
	for _, t := range tpls {
		out = append(out, templateJSON{TemplateID: t.ID, BuildID: t.BuildID, CPUCount: t.CPU,
			MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB, Public: t.Public, Aliases: t.Aliases,
			Names: t.Aliases, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
			LastSpawnedAt: optTime(t.LastSpawnedAt), SpawnCount: t.SpawnCount, BuildCount: buildCount(t),
			EnvdVersion: t.EnvdVersion, BuildStatus: string(t.Status)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	t, _, err := s.driver.LookupTemplate(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	builds := []templateBuildJSON{}
	// Every build of a template made from steps, newest first: a rebuild in progress shows while
	// the template still serves its previous one.
	if list, err := s.store.ListBuilds(r.Context(), t.ID); err == nil {
		for _, b := range list {
			j := templateBuildJSON{BuildID: b.ID, Status: string(b.Status), CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt,
				FinishedAt: optTime(b.FinishedAt), CPUCount: b.CPU, MemoryMB: b.MemoryMB, DiskSizeMB: b.DiskMB,
				EnvdVersion: t.EnvdVersion}
			builds = append(builds, j)
		}
	}
	if len(builds) == 0 && t.BuildID != "" {
		b := templateBuildJSON{BuildID: t.BuildID, Status: string(t.Status), CreatedAt: t.CreatedAt,
			UpdatedAt: t.UpdatedAt, CPUCount: t.CPU, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB,
			EnvdVersion: t.EnvdVersion}
		if t.Status == store.TemplateReady || t.Status == store.TemplateError {
			b.FinishedAt = optTime(t.UpdatedAt)
		}
		builds = append(builds, b)
	}
	writeJSON(w, http.StatusOK, templateWithBuildsJSON{TemplateID: t.ID, Public: t.Public,
		Aliases: t.Aliases, Names: t.Aliases, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
		LastSpawnedAt: optTime(t.LastSpawnedAt), SpawnCount: t.SpawnCount, Builds: builds})
	return nil
}

// templateAlias answers `Template.exists(name)`: 200 when the name resolves, 404 otherwise.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) error {
	t, _, err := s.driver.LookupTemplate(r.Context(), r.PathValue("alias"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct {
		TemplateID string `json:"templateID"`
		Public     bool   `json:"public"`
	}{t.ID, t.Public})
	return nil
}
